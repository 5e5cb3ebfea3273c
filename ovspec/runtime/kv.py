"""KV memory for one sequence: the three layouts and the choice between them.

``CopyAndGrowKV`` sizes buffers to the current rung and copies the live prefix into
new buffers at a boundary; with a ``Prefault`` it faults the successor's copy target
in on a thread before the boundary, so the copy runs at memcpy speed. ``SharedMaxKV``
reserves the top rung once and gives smaller rungs strided views (OpenVINO ROI
tensors) into it, as upstream's pyramid does. ``RemapKV`` (``kvremap``) moves pages
instead of copying them. All hand OpenVINO tensors that share memory with their
arrays, so a decode step never copies the cache. ``choose_layout`` prefers remap
where it works and says why when it falls back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np
import openvino as ov

from ovspec.errors import LadderError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import KVCache, KVSample, KVTrace, Migration, np_dtype, seq_slice
from ovspec.runtime.kvremap import (
    BlockShape,
    RemapKV,
    check_ladder,
    misaligned_rungs,
    quantum_tokens,
)

__all__ = [
    "CopyAndGrowKV",
    "KVCache",
    "KVLayout",
    "KVLayoutWarning",
    "KVSample",
    "KVTrace",
    "LayoutChoice",
    "Migration",
    "Prefault",
    "RemapKV",
    "SharedMaxKV",
    "choose_layout",
    "make_kv",
]


class KVLayout(Enum):
    COPY_AND_GROW = "copy-and-grow"
    SHARED_MAX = "shared-max"
    REMAP = "remap"


class KVLayoutWarning(RuntimeWarning):
    """The layout asked for cannot run here; another one is used instead."""


# --------------------------------------------------------------------------- copy-and-grow


@dataclass(frozen=True)
class Prefault:
    """Fault the successor rung's copy target in ``lead_tokens`` before each boundary,
    on a thread. ``use_memset`` forces memset where ``MADV_POPULATE_WRITE`` exists."""

    ladder: Ladder
    lead_tokens: int = 16
    use_memset: bool = False

    def __post_init__(self) -> None:
        if self.lead_tokens < 1:
            raise LadderError(f"the pre-fault lead must be >= 1 token, got {self.lead_tokens}")


@dataclass(frozen=True)
class PrefaultRecord:
    capacity_tokens: int
    started_at_live_tokens: int
    faulted_bytes: int
    seconds: float  # on the pre-fault thread
    method: str  # "populate-write" or "memset"


class _Buffers:
    """One rung's past tensors: one anonymous mapping (Linux) or numpy zeros elsewhere.

    Zeros either way: masked slots still enter the attention matmul, and a NaN there
    would survive the mask (NaN + -inf is NaN). A mapping commits a page on its first
    write only, so the physical KV follows what is written, whatever numpy's huge-page
    policy or malloc's history would have done.
    """

    def __init__(self, roles: ModelRoles, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        shapes = [role.shape(1, capacity_tokens) for role in roles.kv]
        sizes = [role.bytes_per_token * capacity_tokens for role in roles.kv]
        self.region: vmem.Region | None = None
        if vmem.unsupported_reason() is None:
            offsets = np.cumsum([0] + [vmem.round_up_to_pages(s) for s in sizes]).tolist()
            region = vmem.Region(offsets[-1])
            self.region = region
            self.arrays = {
                role.past_input: region.array(int(offset), shape, np_dtype(role))
                for role, shape, offset in zip(roles.kv, shapes, offsets, strict=False)
            }
        else:
            self.arrays = {
                role.past_input: np.zeros(shape, dtype=np_dtype(role))
                for role, shape in zip(roles.kv, shapes, strict=True)
            }
        self.nbytes = sum(sizes)

    def spans(self) -> list[tuple[int, int]]:
        if self.region is not None:
            return [self.region.span]
        return [(a.ctypes.data, a.nbytes) for a in self.arrays.values()]


class CopyAndGrowKV(KVCache):
    """Buffers sized to the current rung; a boundary allocates, copies the live prefix,
    frees. With ``prefault``, the successor's buffers are mapped and their copy target
    (each block's first ``capacity`` tokens) committed on a thread before the boundary;
    they count as reserved from then on."""

    def __init__(
        self, roles: ModelRoles, capacity_tokens: int, prefault: Prefault | None = None
    ) -> None:
        super().__init__(roles, capacity_tokens)
        self._prefault = prefault
        self._buffers = _Buffers(roles, capacity_tokens)
        self._tensors = self._make_tensors()
        self._pending: _Buffers | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self.prefaults: list[PrefaultRecord] = []

    def _make_tensors(self) -> dict[str, ov.Tensor]:
        return {n: ov.Tensor(a, shared_memory=True) for n, a in self._buffers.arrays.items()}

    def tensors(self) -> dict[str, ov.Tensor]:
        if not self._tensors:
            self._tensors = self._make_tensors()
        return dict(self._tensors)

    def arrays(self) -> dict[str, np.ndarray]:
        return self._buffers.arrays

    @property
    def reserved_bytes(self) -> int:
        pending = self._pending.nbytes if self._pending is not None else 0
        return self._buffers.nbytes + pending

    def spans(self) -> list[tuple[int, int]]:
        pending = self._pending.spans() if self._pending is not None else []
        return self._buffers.spans() + pending

    def write(self, present: Mapping[str, np.ndarray], count_tokens: int) -> None:
        super().write(present, count_tokens)
        plan = self._prefault
        if plan is None or self._pending is not None or self.capacity_tokens not in plan.ladder:
            return
        successor = plan.ladder.successor(self.capacity_tokens)
        if successor is not None and self.live_tokens >= self.capacity_tokens - plan.lead_tokens:
            self.start_prefault(successor)

    def start_prefault(self, capacity_tokens: int) -> None:
        """Map the buffers of ``capacity_tokens`` now and commit, on a thread, the range
        the boundary copy will write (the current capacity: all live at the boundary)."""
        self.wait_prefault()
        pending = _Buffers(self.roles, capacity_tokens)
        prefix = self.capacity_tokens
        spans = []
        for role in self.roles.kv:
            shape = BlockShape.of(role)
            base = pending.arrays[role.past_input].ctypes.data
            for block in range(shape.blocks):
                at = base + block * capacity_tokens * shape.token_bytes
                spans.append((at, prefix * shape.token_bytes))
        self._pending = pending
        self._thread_error = None
        use_memset = self._prefault.use_memset if self._prefault is not None else False
        self._thread = threading.Thread(
            target=self._fault_in,
            args=(capacity_tokens, self.live_tokens, spans, use_memset),
            name="ovspec-prefault",
            daemon=True,
        )
        self._thread.start()

    def _fault_in(
        self, capacity_tokens: int, at_live: int, spans: list[tuple[int, int]], memset: bool
    ) -> None:
        began = time.perf_counter()
        try:
            faulted = vmem.populate_write(spans, use_memset=memset)
        except BaseException as exc:  # re-raised by grow() on the decode thread
            self._thread_error = exc
            return
        in_kernel = vmem.populate_write_supported() and not memset
        self.prefaults.append(
            PrefaultRecord(
                capacity_tokens,
                at_live,
                faulted,
                time.perf_counter() - began,
                "populate-write" if in_kernel else "memset",
            )
        )

    def wait_prefault(self) -> None:
        """Block until a running pre-fault is done (``grow`` does this by itself)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._thread_error is not None:
            error, self._thread_error = self._thread_error, None
            self._pending = None
            raise error

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        old = self._buffers
        start = time.perf_counter()
        self.wait_prefault()
        new = self._pending
        if new is None or new.capacity_tokens != capacity_tokens:
            new = _Buffers(self.roles, capacity_tokens)
        self._pending = None
        live = self.live_tokens
        copied = 0
        for role in self.roles.kv:
            src = old.arrays[role.past_input][seq_slice(role, 0, live)]
            new.arrays[role.past_input][seq_slice(role, 0, live)] = src
            copied += src.nbytes
        copy_s = time.perf_counter() - start
        peak = self._peak(old.spans() + new.spans())  # untimed: old and new both held
        old_bytes = old.nbytes
        # Freeing the old buffers is part of the boundary (unmapping committed pages costs
        # about as much as a small copy): drop the last references inside the timing.
        freed = time.perf_counter()
        self._buffers, self._tensors = new, {}  # tensors are made when bound, as remap's
        del old
        seconds = copy_s + time.perf_counter() - freed
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=copied,
            allocated_bytes=new.nbytes,
            seconds=seconds,
            peak_reserved_bytes=old_bytes + new.nbytes,
            peak_physical_bytes=peak,
            copy_seconds=copy_s,
        )
        self.capacity_tokens = capacity_tokens
        return migration

    def close(self) -> None:
        try:
            self.wait_prefault()
        finally:
            self._pending = None


# --------------------------------------------------------------------------- shared-max


class SharedMaxKV(KVCache):
    """One buffer at the top capacity, reserved from the start; each rung binds a view.

    ``dense_views`` (the default): rung C's past is the first C-rung's worth of the flat
    buffer, a dense array, and a boundary re-strides the live KV in place (no new
    allocation; the bytes move up inside the one buffer, the free slots are zeroed).
    Strided views (each head's rows a top rung apart) cost the CPU plugin a slower step
    on every call and cannot be warmed up (OpenVINO 2026.4 corrupts its heap when a
    compiled model runs dense inputs and then strided ones); they are kept for the
    measurement (docs/benchmarks/bench.md).
    """

    def __init__(
        self,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        dense_views: bool = True,
    ) -> None:
        if capacity_tokens > max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {max_capacity_tokens}"
            )
        super().__init__(roles, capacity_tokens)
        self.max_capacity_tokens = max_capacity_tokens
        self.dense_views = dense_views
        self._full = {
            role.past_input: np.zeros(role.shape(1, max_capacity_tokens), dtype=np_dtype(role))
            for role in roles.kv
        }
        # The parent tensors must outlive every ROI view made from them.
        self._parents = {name: ov.Tensor(a, shared_memory=True) for name, a in self._full.items()}

    def _dense(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        flat = self._full[name].reshape(-1)
        return flat[: int(np.prod(shape))].reshape(shape)

    def tensors(self) -> dict[str, ov.Tensor]:
        if self.dense_views:
            return {
                name: ov.Tensor(array, shared_memory=True) for name, array in self.arrays().items()
            }
        views = {}
        for role in self.roles.kv:
            end = role.shape(1, self.capacity_tokens)
            views[role.past_input] = ov.Tensor(self._parents[role.past_input], [0] * len(end), end)
        return views

    def arrays(self) -> dict[str, np.ndarray]:
        if self.dense_views:
            return {
                role.past_input: self._dense(
                    role.past_input, tuple(role.shape(1, self.capacity_tokens))
                )
                for role in self.roles.kv
            }
        return {
            role.past_input: self._full[role.past_input][seq_slice(role, 0, self.capacity_tokens)]
            for role in self.roles.kv
        }

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._full.values())

    def spans(self) -> list[tuple[int, int]]:
        return [(a.ctypes.data, a.nbytes) for a in self._full.values()]

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        if capacity_tokens > self.max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {self.max_capacity_tokens}"
            )
        start = time.perf_counter()
        moved = 0
        live = self.live_tokens
        if self.dense_views:
            for role in self.roles.kv:
                old = self._dense(role.past_input, tuple(role.shape(1, self.capacity_tokens)))
                new = self._dense(role.past_input, tuple(role.shape(1, capacity_tokens)))
                # The views overlap; numpy copies through a buffer when they do.
                new[seq_slice(role, 0, live)] = old[seq_slice(role, 0, live)]
                new[seq_slice(role, live, capacity_tokens)] = 0  # stale rows: zeros, as new
                moved += role.bytes_per_token * live
        seconds = time.perf_counter() - start
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=moved,
            allocated_bytes=0,
            seconds=seconds,
            peak_reserved_bytes=self.reserved_bytes,
            peak_physical_bytes=self._peak(self.spans()),
            copy_seconds=seconds,
        )
        self.capacity_tokens = capacity_tokens
        return migration


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class LayoutChoice:
    """The layout a sequence gets, and why when it is not the one asked for."""

    layout: KVLayout
    note: str = ""  # empty when the request was honoured as asked
    failover: bool = False  # remap was asked for explicitly and cannot run here


def choose_layout(requested: KVLayout | None, roles: ModelRoles, ladder: Ladder) -> LayoutChoice:
    """``requested`` None is the default: remap where it works, else copy-and-grow.

    An explicit remap on a platform that cannot map pages fails over to copy-and-grow
    (``failover``: the caller warns); an explicit remap over a ladder it cannot map is
    refused (``LadderError``, one line naming the nearest aligned capacities).
    """
    if requested is not None and requested is not KVLayout.REMAP:
        return LayoutChoice(requested)
    reason = vmem.unsupported_reason()
    if reason is not None:
        note = f"the remap KV layout cannot run here ({reason}); using copy-and-grow"
        return LayoutChoice(KVLayout.COPY_AND_GROW, note, failover=requested is KVLayout.REMAP)
    if requested is KVLayout.REMAP:
        check_ladder(roles, ladder)
        return LayoutChoice(KVLayout.REMAP)
    bad = misaligned_rungs(roles, ladder)
    if bad:
        return LayoutChoice(
            KVLayout.COPY_AND_GROW,
            f"rung{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} not page-aligned for "
            f"the remap KV layout (multiples of {quantum_tokens(roles)} tokens); "
            "using copy-and-grow",
        )
    return LayoutChoice(KVLayout.REMAP)


def make_kv(
    layout: KVLayout,
    roles: ModelRoles,
    capacity_tokens: int,
    max_capacity_tokens: int,
    prefault: Prefault | None = None,
    ladder: Ladder | None = None,
) -> KVCache:
    """The KV cache of ``layout``. ``ladder`` lets the remap layout build each growth
    ahead of its boundary (see ``RemapKV.prepare_growth``)."""
    if layout is KVLayout.SHARED_MAX:
        return SharedMaxKV(roles, capacity_tokens, max_capacity_tokens)
    if layout is KVLayout.REMAP:
        return RemapKV(roles, capacity_tokens, max_capacity_tokens, ladder)
    return CopyAndGrowKV(roles, capacity_tokens, prefault)
