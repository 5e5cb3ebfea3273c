"""One sequence decoding over a ladder of static graphs: prefill, steps, boundaries.

The session owns the KV memory, the bound infer request of the active rung, and a
record of every step and boundary. It asks a ``Programs`` source for compiled
graphs (the lazy loader, or anything with ``get``) and never compiles itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import openvino as ov

from ovspec.compile.halves import CompiledGraph
from ovspec.errors import LadderError
from ovspec.ir.graph_io import LIVE_TOKENS_VARIABLE, PRESENTS_OUTPUT
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import Specialization, prefill_specialization
from ovspec.ladder import Ladder
from ovspec.runtime.kvcache import KVCache, Migration


class Programs(Protocol):
    """Where compiled graphs come from. ``get`` may block; it reports its wait.
    ``release`` says this sequence is done with a graph (it may be dropped)."""

    def get(self, spec: Specialization) -> CompiledGraph: ...

    def release(self, spec: Specialization) -> None: ...


@dataclass(frozen=True)
class StepRecord:
    live_tokens: int  # KV positions before this step
    capacity_tokens: int
    new_tokens: int  # 1 for decode, the real tokens of a prefill chunk
    prefill: bool
    began_s: float  # seconds since the session's origin
    infer_s: float


@dataclass(frozen=True)
class BoundaryRecord:
    at_live_tokens: int
    began_s: float  # seconds since the session's origin
    migration: Migration
    program_wait_s: float  # time blocked in Programs.get for the new rung's graph
    bind_s: float


class _Bound:
    """An infer request of one graph with its inputs bound to shared arrays.

    A graph takes the mask and positions as inputs (the session keeps them), or keeps
    the live length as state (the live-tokens rewrite: set once at binding; the graph
    builds its own mask and positions and advances the state by each call's tokens).
    Its chunk is fixed (a short chunk is right-padded and its pads masked) or 1..P
    tokens (a short chunk goes in as it is). Logits are one row (the last-position LM
    head) or one per chunk position.
    """

    def __init__(
        self, compiled: CompiledGraph, roles: ModelRoles, spec: Specialization, kv: KVCache
    ) -> None:
        self.spec = spec
        self.request = compiled.create_infer_request()
        self._roles = roles
        self.capacity = spec.capacity_tokens
        names = {port.get_any_name() for port in compiled.inputs}
        self.live_state = roles.attention_mask not in names
        # One stacked output for every present (the merged-presents rewrite), or one each.
        self.merged_presents = any(PRESENTS_OUTPUT in port.names for port in compiled.outputs)
        chunk_dim = compiled.input(roles.input_ids).get_partial_shape()[1]
        self.chunk_varies = chunk_dim.is_dynamic
        self.chunk = spec.chunk_tokens if self.chunk_varies else chunk_dim.get_length()
        self.input_ids = np.zeros((1, self.chunk), dtype=np.int64)
        self.position_ids = np.zeros((1, self.chunk), dtype=np.int64)
        self.mask = np.zeros((1, self.capacity + self.chunk), dtype=np.int64)
        self.mask[0, self.capacity :] = 1
        self.mask[0, : kv.live_tokens] = 1
        self._has_positions = roles.position_ids is not None and roles.position_ids in names
        self._fed = -1  # tokens the bound input tensors hold (a 1..P graph rebinds per size)
        if self.live_state:
            self._state = next(
                st for st in self.request.query_state() if st.name == LIVE_TOKENS_VARIABLE
            )
            self._state.state = ov.Tensor(np.array([kv.live_tokens], dtype=np.int32))
        for name, tensor in kv.tensors().items():
            self.request.set_tensor(name, tensor)

    def feed(self, token_ids: Sequence[int], live_tokens: int) -> None:
        """Put ``token_ids`` (1..chunk of them) at positions from ``live_tokens`` on; the
        past part of the mask stays the caller's to keep."""
        n = len(token_ids)
        width = n if self.chunk_varies else self.chunk
        if self.live_state and width != n:
            raise LadderError(f"{self.spec.label} keeps its length as state: it cannot pad")
        self.input_ids[0, :n] = token_ids
        self.input_ids[0, n:] = token_ids[-1]
        self.position_ids[0, :width] = np.arange(live_tokens, live_tokens + width)
        cap = self.capacity
        self.mask[0, cap : cap + n] = 1
        self.mask[0, cap + n :] = 0  # pads: no query sees them (and only real rows are kept)
        if width != self._fed:
            self._bind(width)

    def _bind(self, width: int) -> None:
        roles = self._roles
        ids = self.input_ids[:, :width]
        self.request.set_tensor(roles.input_ids, ov.Tensor(ids, shared_memory=True))
        if not self.live_state:
            mask = self.mask[:, : self.capacity + width]
            self.request.set_tensor(roles.attention_mask, ov.Tensor(mask, shared_memory=True))
            if self._has_positions:
                assert roles.position_ids is not None
                positions = self.position_ids[:, :width]
                self.request.set_tensor(
                    roles.position_ids, ov.Tensor(positions, shared_memory=True)
                )
        self._fed = width

    def run(self) -> None:
        self.request.infer()

    def output(self, name: str) -> np.ndarray:
        data: np.ndarray = self.request.get_tensor(name).data
        return data

    def presents(self) -> dict[str, np.ndarray]:
        """Each present output's new K/V by name (views, valid until the next call)."""
        kv = self._roles.kv
        if self.merged_presents:
            stacked = self.output(PRESENTS_OUTPUT)  # [L*B, ...]: layer i is rows i*B..
            b = stacked.shape[0] // len(kv)
            return {role.present_output: stacked[i * b : (i + 1) * b] for i, role in enumerate(kv)}
        return {role.present_output: self.output(role.present_output) for role in kv}

    def logits(self, real_tokens: int) -> np.ndarray:
        """The last real token's logits (row 0 of a last-position head)."""
        rows = self.output(self._roles.logits)[0]
        return np.array(rows[0 if rows.shape[0] == 1 else real_tokens - 1], copy=True)


class DecodeSession:
    """Greedy or teacher-forced decoding of one sequence (batch 1)."""

    def __init__(
        self,
        roles: ModelRoles,
        ladder: Ladder,
        kv: KVCache,
        programs: Programs,
        prefill_chunk_tokens: int,
        origin_s: float | None = None,
        release_passed: bool = False,
    ) -> None:
        self.roles = roles
        self.ladder = ladder
        self.kv = kv
        self.programs = programs
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.origin_s = time.perf_counter() if origin_s is None else origin_s
        # A sequence never returns to a smaller rung: its graphs can go once passed.
        self.release_passed = release_passed
        self.steps: list[StepRecord] = []
        self.boundaries: list[BoundaryRecord] = []
        self._decode: _Bound | None = None
        self._left: list[Specialization] = []  # passed rungs whose release waits for close

    @property
    def live_tokens(self) -> int:
        return self.kv.live_tokens

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Run the prompt in static chunks; returns the last prompt token's logits."""
        if not token_ids:
            raise LadderError("the prompt is empty; give at least one token")
        if self.kv.live_tokens:
            raise LadderError("prefill runs on an empty KV cache only")
        needed = self.ladder.rung_for(len(token_ids))
        if needed > self.kv.capacity_tokens:
            self.kv.grow(needed)  # nothing live yet: an allocation, not a boundary
        cap = self.kv.capacity_tokens
        spec = prefill_specialization(cap, self.prefill_chunk_tokens)
        bound = _Bound(self.programs.get(spec), self.roles, spec, self.kv)
        chunk = spec.chunk_tokens
        logits = np.empty(0, dtype=np.float32)
        for start in range(0, len(token_ids), chunk):
            piece = token_ids[start : start + chunk]
            n = len(piece)
            t = self.kv.live_tokens
            # A short last chunk is right-padded with its pads masked (or passed as it is
            # to a graph taking 1..P tokens); only the real tokens' K/V are written back.
            bound.feed(piece, t)
            bound.mask[0, :t] = 1
            bound.mask[0, t:cap] = 0
            began = time.perf_counter()
            bound.run()
            self.steps.append(
                StepRecord(t, cap, n, True, began - self.origin_s, time.perf_counter() - began)
            )
            self.kv.write(bound.presents(), n)
            logits = bound.logits(n)
        del bound  # the request goes before its graph may be released
        if self.release_passed:
            self.programs.release(spec)
        return logits

    def step(self, token_id: int) -> np.ndarray:
        """Decode one token; returns its logits. Crosses a boundary first if the rung is full."""
        t = self.kv.live_tokens
        if t >= self.kv.capacity_tokens:
            self._migrate(self.ladder.rung_for(t + 1))
        bound = self._decode_bound()
        bound.feed((token_id,), t)
        began = time.perf_counter()
        bound.run()
        self.steps.append(
            StepRecord(
                t,
                self.kv.capacity_tokens,
                1,
                False,
                began - self.origin_s,
                time.perf_counter() - began,
            )
        )
        self.kv.write(bound.presents(), 1)
        bound.mask[0, t] = 1
        return bound.logits(1)

    def truncate(self, live_tokens: int) -> None:
        """Keep only the first ``live_tokens`` of the KV (a conversation rewinding); the
        decode request is bound again, its mask and live-length state from the KV."""
        if not 0 <= live_tokens <= self.kv.live_tokens:
            raise LadderError(f"cannot keep {live_tokens} of {self.kv.live_tokens} live tokens")
        self.kv.live_tokens = live_tokens
        self._decode = None

    def close(self) -> None:
        # Requests go before the KV arrays they point into.
        self._decode = None
        while self._left:
            self.programs.release(self._left.pop())

    def _decode_bound(self) -> _Bound:
        cap = self.kv.capacity_tokens
        if self._decode is None or self._decode.spec.capacity_tokens != cap:
            self._decode = _Bound(
                self.programs.get(Specialization.decode(cap)),
                self.roles,
                Specialization.decode(cap),
                self.kv,
            )
        return self._decode

    def _migrate(self, capacity_tokens: int) -> None:
        at = self.kv.live_tokens
        crossed = time.perf_counter()
        passed = self._decode.spec if self._decode is not None else None
        self._decode = None
        migration = self.kv.grow(capacity_tokens)
        began = time.perf_counter()
        compiled = self.programs.get(Specialization.decode(capacity_tokens))
        waited = time.perf_counter() - began
        began = time.perf_counter()
        self._decode = _Bound(compiled, self.roles, Specialization.decode(capacity_tokens), self.kv)
        if passed is not None and self.release_passed:
            # Dropping a compiled model stalls the decode (its destructor frees the packed
            # weights holding the GIL: ~0.1 s for 1 GB), so it happens only where the
            # memory is needed: while a successor loads (one-ahead queued it in the get
            # above). Past the last boundary nothing loads, and holding the passed rung
            # to the end keeps the peak it had here.
            if self.ladder.successor(capacity_tokens) is None:
                self._left.append(passed)
            else:
                self.programs.release(passed)
        self.boundaries.append(
            BoundaryRecord(
                at, crossed - self.origin_s, migration, waited, time.perf_counter() - began
            )
        )
