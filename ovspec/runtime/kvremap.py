"""The ``remap`` KV layout: zero-copy growth, physical memory that follows the tokens.

All past tensors of a rung live in one anonymous mapping, each a dense
``[1, H, C, D]`` range whose per-head *blocks* are whole pages. Growing C -> C' maps
a new range and moves each block's written pages to the block's new offset with
``mremap``: page-table entries change address, no K/V byte is copied, and pages the
sequence never wrote stay uncommitted (the attention reads them as the zero page).
Here too: the page alignment a ladder needs, and the one-line refusal with the
nearest aligned capacities when it is not.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import openvino as ov

from ovspec.errors import LadderError, RemapUnsupportedError
from ovspec.ir.roles import KVRole, ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import KVCache, Migration, np_dtype


@dataclass(frozen=True)
class BlockShape:
    """How one past tensor splits into blocks that move whole at a boundary.

    ``blocks`` is the product of the axes between batch and the sequence axis (the KV
    heads of ``[1, H, C, D]``); one block holds ``capacity * token_bytes`` bytes.
    """

    blocks: int
    token_bytes: int

    @classmethod
    def of(cls, role: KVRole) -> BlockShape:
        dims = role.shape(1, 1)
        inner = math.prod(dims[role.seq_axis + 1 :])
        return cls(math.prod(dims[1 : role.seq_axis]), inner * int(role.element_type.size))

    def quantum_tokens(self, page_bytes: int) -> int:
        """The smallest capacity step whose blocks are whole pages (1 for a single block,
        which starts the tensor's range and so never needs to)."""
        if self.blocks == 1:
            return 1
        return page_bytes // math.gcd(page_bytes, self.token_bytes)


def quantum_tokens(roles: ModelRoles, page_bytes: int = vmem.PAGE_BYTES) -> int:
    """Capacities the remap layout can use are the multiples of this many tokens."""
    return math.lcm(1, *(BlockShape.of(role).quantum_tokens(page_bytes) for role in roles.kv))


def misaligned_rungs(
    roles: ModelRoles, ladder: Ladder, page_bytes: int = vmem.PAGE_BYTES
) -> list[int]:
    quantum = quantum_tokens(roles, page_bytes)
    return [c for c in ladder if c % quantum]


def nearest_aligned(capacity_tokens: int, quantum: int) -> tuple[int, int]:
    """The aligned capacities at or below and at or above (the low one is 0 when no
    positive aligned capacity is below)."""
    below = capacity_tokens // quantum * quantum
    return below, below if below == capacity_tokens else below + quantum


def aligned_ladder(ladder: Ladder, quantum: int) -> Ladder:
    """Each rung rounded to its nearest aligned capacity (ties and 0 go up), kept
    strictly increasing: the ladder to suggest instead."""
    caps: list[int] = []
    for cap in ladder:
        below, above = nearest_aligned(cap, quantum)
        pick = below if below > 0 and cap - below < above - cap else above
        caps.append(max(pick, caps[-1] + quantum) if caps else pick)
    return Ladder(tuple(caps))


def check_ladder(roles: ModelRoles, ladder: Ladder, page_bytes: int = vmem.PAGE_BYTES) -> None:
    """Raise ``LadderError`` (one line: which rungs, why, what to use) unless every rung
    of ``ladder`` can be mapped by the remap layout."""
    bad = misaligned_rungs(roles, ladder, page_bytes)
    if not bad:
        return
    quantum = quantum_tokens(roles, page_bytes)
    token_bytes = min(BlockShape.of(r).token_bytes for r in roles.kv if BlockShape.of(r).blocks > 1)
    nearest = "; ".join(
        f"{c} -> {' or '.join(str(x) for x in sorted(set(nearest_aligned(c, quantum))) if x)}"
        for c in bad
    )
    raise LadderError(
        f"the remap KV layout cannot map rung{'s' if len(bad) > 1 else ''} "
        f"{', '.join(map(str, bad))}: a KV head block (capacity x {token_bytes} bytes) must "
        f"be whole {page_bytes}-byte pages, so capacities must be multiples of {quantum} "
        f"tokens (nearest: {nearest}); use --ladder {aligned_ladder(ladder, quantum)} or "
        "--kv-layout copy-and-grow"
    )


class RemapKV(KVCache):
    """Dense past tensors in one mapping per rung; growth moves pages, copies nothing.

    ``reserved_bytes`` is the current rung's dense range (address space, as the other
    layouts count it); ``committed_bytes`` is what the written tokens occupy in whole
    pages, and ``physical_bytes()`` reads it back from the kernel. A grown-out-of range
    stays mapped, empty, until ``close``: a request still bound to it reads zeros, never
    memory some later mapping reused.
    """

    def __init__(self, roles: ModelRoles, capacity_tokens: int) -> None:
        reason = vmem.unsupported_reason()
        if reason is not None:
            raise RemapUnsupportedError(
                f"the remap KV layout cannot run here: {reason}; use copy-and-grow"
            )
        check_ladder(roles, Ladder((capacity_tokens,)))
        super().__init__(roles, capacity_tokens)
        self._shapes = [BlockShape.of(role) for role in roles.kv]
        self._retired: list[vmem.Region] = []
        self._region = vmem.Region(self._layout_bytes(capacity_tokens)[-1])
        self._arrays: dict[str, np.ndarray] = {}
        self._tensors: dict[str, ov.Tensor] = {}
        self._bind()

    def _layout_bytes(self, capacity_tokens: int) -> list[int]:
        """Offsets of each tensor in a rung's mapping, then the mapping's size."""
        offsets = [0]
        for shape in self._shapes:
            size = shape.blocks * capacity_tokens * shape.token_bytes
            offsets.append(offsets[-1] + vmem.round_up_to_pages(size))
        return offsets

    def _bind(self) -> None:
        offsets = self._layout_bytes(self.capacity_tokens)
        self._arrays = {
            role.past_input: self._region.array(
                offset, role.shape(1, self.capacity_tokens), np_dtype(role)
            )
            for role, offset in zip(self.roles.kv, offsets, strict=False)
        }
        self._tensors = {}

    def tensors(self) -> dict[str, ov.Tensor]:
        # Made on first use after a growth: binding is the session's to time.
        if not self._tensors:
            self._tensors = {n: ov.Tensor(a, shared_memory=True) for n, a in self._arrays.items()}
        return dict(self._tensors)

    def arrays(self) -> dict[str, np.ndarray]:
        return self._arrays

    @property
    def reserved_bytes(self) -> int:
        return self.bytes_for(self.capacity_tokens)

    @property
    def committed_bytes(self) -> int:
        """The page model: per block, the pages its written tokens touch."""
        return sum(
            shape.blocks * self._live_block_bytes(shape, self.live_tokens) for shape in self._shapes
        )

    @staticmethod
    def _live_block_bytes(shape: BlockShape, live_tokens: int) -> int:
        return vmem.round_up_to_pages(live_tokens * shape.token_bytes)

    def spans(self) -> list[tuple[int, int]]:
        return [self._region.span]

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        check_ladder(self.roles, Ladder((capacity_tokens,)))
        old_capacity, live = self.capacity_tokens, self.live_tokens
        began = time.perf_counter()
        old = self._region
        new = vmem.Region(self._layout_bytes(capacity_tokens)[-1])
        moves = []
        old_offsets = self._layout_bytes(old_capacity)
        new_offsets = self._layout_bytes(capacity_tokens)
        for shape, old_at, new_at in zip(self._shapes, old_offsets, new_offsets, strict=False):
            size = self._live_block_bytes(shape, live)
            for block in range(shape.blocks):
                moves.append(
                    vmem.PageMove(
                        src=old.addr + old_at + block * old_capacity * shape.token_bytes,
                        dst=new.addr + new_at + block * capacity_tokens * shape.token_bytes,
                        size_bytes=size,
                    )
                )
        moved = vmem.move_pages(moves)  # all or none; on a refusal `new` is dropped
        self._region = new
        self._retired.append(old)
        self.capacity_tokens = capacity_tokens
        self._bind()
        seconds = time.perf_counter() - began
        return Migration(
            from_capacity_tokens=old_capacity,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=0,
            allocated_bytes=self.bytes_for(capacity_tokens),
            seconds=seconds,
            # The grown-out-of range is empty address space from here on: not reserved.
            peak_reserved_bytes=self.bytes_for(capacity_tokens),
            moved_bytes=moved,
            peak_physical_bytes=vmem.resident_bytes([old.span, new.span]),
        )

    def close(self) -> None:
        # Dropping the references unmaps each range as soon as no view holds it.
        self._arrays, self._tensors = {}, {}
        self._retired = []
