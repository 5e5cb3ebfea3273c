"""The copy-and-grow KV layout: buffers sized to the current rung, copied at a boundary.

A boundary allocates the successor's buffers, copies the live prefix into them and
frees the old ones; with a ``Prefault`` the successor's copy target is faulted in on a
thread before the boundary, so the copy runs at memcpy speed. It takes any model and
any ladder: the layout every other one falls back to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import openvino as ov

from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import (
    BlockShape,
    KVCache,
    KVLayout,
    Migration,
    Prefault,
    np_dtype,
    seq_slice,
)


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
    they count as reserved from then on. Any model and ladder."""

    layout: ClassVar[KVLayout] = KVLayout.COPY_AND_GROW
    chosen_by_default: ClassVar[bool] = True

    @classmethod
    def create(
        cls,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        ladder: Ladder | None = None,
        prefault: Prefault | None = None,
    ) -> CopyAndGrowKV:
        return cls(roles, capacity_tokens, prefault)

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
