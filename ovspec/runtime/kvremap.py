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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import openvino as ov

from ovspec.errors import LadderError, RemapUnsupportedError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import (
    BlockShape,
    KVCache,
    KVLayout,
    Migration,
    Prefault,
    Unsupported,
    np_dtype,
)


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


def check_ladder(
    roles: ModelRoles,
    ladder: Ladder,
    page_bytes: int = vmem.PAGE_BYTES,
    otherwise: str = "--kv-layout copy-and-grow",
) -> None:
    """Raise ``LadderError`` (one line: which rungs, why, what to use, ``otherwise`` the
    way out without remap) unless every rung of ``ladder`` can be mapped by the remap
    layout."""
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
        f"{otherwise}"
    )


@dataclass(frozen=True)
class _Growth:
    """A growth built ahead of its boundary: page moves, then the new rung's bindings."""

    from_capacity_tokens: int
    to_capacity_tokens: int
    moves: list[vmem.PageMove]
    arrays: dict[str, np.ndarray]
    tensors: dict[str, ov.Tensor]
    full_moved_bytes: int  # what the moves carry when every old slot is live
    seconds: float

    def matches(self, from_capacity_tokens: int, to_capacity_tokens: int) -> bool:
        return (from_capacity_tokens, to_capacity_tokens) == (
            self.from_capacity_tokens,
            self.to_capacity_tokens,
        )


class RemapKV(KVCache):
    """Dense past tensors that grow in place; growth moves pages, copies nothing.

    Each past tensor owns one mapping sized for the top rung (address space only: a
    page is committed by its first write). The rung-C tensor ``[1, H, C, D]`` is the
    mapping's first ``H*C*D`` elements. Growing to C' moves head block h (h = H-1 down
    to 1) from offset ``h*C`` to ``h*C'`` with ``mremap``; block 0 stays where it is,
    and the slots a move vacates read as zeros (the new rung's empty capacity).

    ``reserved_bytes`` is the current rung's dense range, as the other layouts count it;
    ``committed_bytes`` is what the written tokens occupy in whole pages, and
    ``physical_bytes()`` reads it back from the kernel. Arrays and tensors of a rung
    stay mapped after a growth (a request still bound to one reads the new layout's
    bytes, never memory some other mapping reused) and go with ``close``.

    Given the ``ladder``, the first write on a rung builds the growth to its successor
    (``prepare_growth``: the move list, the views, the tensors), so the boundary itself
    is the ``mremap`` calls and a swap of bindings.
    """

    layout: ClassVar[KVLayout] = KVLayout.REMAP
    # The default where it runs: it never copies and never holds two rungs at once.
    chosen_by_default: ClassVar[bool] = True

    @classmethod
    def create(
        cls,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        ladder: Ladder | None = None,
        prefault: Prefault | None = None,
    ) -> RemapKV:
        return cls(roles, capacity_tokens, max_capacity_tokens, ladder)

    @classmethod
    def unsupported(cls, roles: ModelRoles, ladder: Ladder) -> Unsupported | None:
        """Pages that cannot be moved here (the platform), or rungs whose head blocks
        are not whole pages (the ladder)."""
        reason = vmem.unsupported_reason()
        if reason is not None:
            return Unsupported(f"the remap KV layout cannot run here ({reason})", platform=True)
        bad = misaligned_rungs(roles, ladder)
        if not bad:
            return None
        return Unsupported(
            f"rung{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} not page-aligned "
            f"for the remap KV layout (multiples of {quantum_tokens(roles)} tokens)"
        )

    @classmethod
    def refuse(cls, roles: ModelRoles, ladder: Ladder) -> None:
        check_ladder(roles, ladder)

    def __init__(
        self,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        ladder: Ladder | None = None,
    ) -> None:
        reason = vmem.unsupported_reason()
        if reason is not None:
            raise RemapUnsupportedError(
                f"the remap KV layout cannot run here: {reason}; use copy-and-grow"
            )
        if capacity_tokens > max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the remap maximum {max_capacity_tokens}"
            )
        check_ladder(roles, Ladder((capacity_tokens,)))
        super().__init__(roles, capacity_tokens)
        self.max_capacity_tokens = max_capacity_tokens
        self._shapes = [BlockShape.of(role) for role in roles.kv]
        self._quantum = quantum_tokens(roles)
        self._dtypes = [np_dtype(role) for role in roles.kv]
        self._regions = [
            vmem.Region(shape.blocks * max_capacity_tokens * shape.token_bytes)
            for shape in self._shapes
        ]
        self._scratch: vmem.Region | None = None  # for moves whose ranges overlap
        self._arrays: dict[str, np.ndarray] = {}
        self._tensors: dict[str, ov.Tensor] = {}
        self._ladder = ladder
        self._prepared: _Growth | None = None
        self._bind()

    def _bind(self) -> None:
        self._arrays = self._views(self.capacity_tokens)
        self._tensors = {}

    def _views(self, capacity_tokens: int) -> dict[str, np.ndarray]:
        return {
            role.past_input: region.array(0, role.shape(1, capacity_tokens), dtype)
            for role, region, dtype in zip(self.roles.kv, self._regions, self._dtypes, strict=True)
        }

    def write(self, present: Mapping[str, np.ndarray], count_tokens: int) -> None:
        super().write(present, count_tokens)
        if self._ladder is not None and self._prepared is None:
            successor = self._ladder.successor(self.capacity_tokens)
            if successor is not None and successor <= self.max_capacity_tokens:
                self.prepare_growth(successor)

    def _check_remap_growth(self, capacity_tokens: int) -> None:
        self._check_growth(capacity_tokens)
        if capacity_tokens > self.max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the remap maximum {self.max_capacity_tokens}"
            )
        if capacity_tokens % self._quantum:
            check_ladder(self.roles, Ladder((capacity_tokens,)))  # raises, naming the fix

    def prepare_growth(self, capacity_tokens: int) -> None:
        """Build the growth to ``capacity_tokens`` now (its page moves, its views and
        tensors), so that the boundary only moves pages and swaps bindings.

        The moves take each block whole (its ``capacity`` tokens, not only the live
        ones): at a boundary every slot is live, and a move of pages nobody wrote only
        updates the page tables, so the plan stays right however many tokens come first.
        """
        self._check_remap_growth(capacity_tokens)
        began = time.perf_counter()
        moves = self._moves(self.capacity_tokens, capacity_tokens, self.capacity_tokens)[0]
        arrays = self._views(capacity_tokens)
        tensors = {n: ov.Tensor(a, shared_memory=True) for n, a in arrays.items()}
        self._prepared = _Growth(
            self.capacity_tokens,
            capacity_tokens,
            moves,
            arrays,
            tensors,
            self._moved_bytes(self.capacity_tokens),
            time.perf_counter() - began,
        )

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
        """The current rung's range of each mapping (nothing beyond it is ever written)."""
        return [
            (
                region.addr,
                vmem.round_up_to_pages(shape.blocks * self.capacity_tokens * shape.token_bytes),
            )
            for region, shape in zip(self._regions, self._shapes, strict=True)
        ]

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_remap_growth(capacity_tokens)
        old_capacity, live = self.capacity_tokens, self.live_tokens
        prepared, self._prepared = self._prepared, None
        began = time.perf_counter()
        if prepared is not None and prepared.matches(old_capacity, capacity_tokens):
            vmem.move_pages(prepared.moves)  # all or none
            self._arrays, self._tensors = prepared.arrays, prepared.tensors
            self.capacity_tokens = capacity_tokens
            seconds = time.perf_counter() - began
            full = live == old_capacity  # as at a boundary
            moved = prepared.full_moved_bytes if full else self._moved_bytes(live)
        else:
            moves, moved = self._moves(old_capacity, capacity_tokens, live)
            vmem.move_pages(moves)
            self._arrays, self._tensors = self._views(capacity_tokens), {}
            self.capacity_tokens = capacity_tokens
            seconds = time.perf_counter() - began
        return Migration(
            from_capacity_tokens=old_capacity,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=0,
            allocated_bytes=self.bytes_for(capacity_tokens - old_capacity),
            seconds=seconds,
            peak_reserved_bytes=self.bytes_for(capacity_tokens),  # one range, grown in place
            moved_bytes=moved,
            peak_physical_bytes=self._peak(self.spans()) if self.measure_physical else None,
        )

    def _moved_bytes(self, live: int) -> int:
        """The bytes of written pages a growth moves: every block but the first."""
        return sum(
            (shape.blocks - 1) * self._live_block_bytes(shape, live) for shape in self._shapes
        )

    def _moves(
        self, old_capacity: int, capacity_tokens: int, live: int
    ) -> tuple[list[vmem.PageMove], int]:
        """The page moves of a growth and the bytes of the blocks they move. Highest block
        first, so no move lands on a block still to move. A block whose new range overlaps
        its old one (fine ladders: h*(C'-C) < its live bytes) goes through a scratch
        range: mremap refuses overlapping ranges."""
        moves: list[vmem.PageMove] = []
        moved = 0
        for region, shape in zip(self._regions, self._shapes, strict=True):
            size = self._live_block_bytes(shape, live)
            if not size:
                continue
            for block in range(shape.blocks - 1, 0, -1):
                moved += size
                src = region.addr + block * old_capacity * shape.token_bytes
                dst = region.addr + block * capacity_tokens * shape.token_bytes
                if dst >= src + size:
                    moves.append(vmem.PageMove(src, dst, size))
                    continue
                scratch = self._scratch_for(size)
                moves.append(vmem.PageMove(src, scratch, size))
                moves.append(vmem.PageMove(scratch, dst, size))
        return moves, moved

    def _scratch_for(self, size: int) -> int:
        if self._scratch is None or self._scratch.size_bytes < size:
            block = max(self.max_capacity_tokens * s.token_bytes for s in self._shapes)
            self._scratch = vmem.Region(block)
        return self._scratch.addr

    @property
    def prepared_seconds(self) -> float | None:
        """How long building the pending growth took (None when none is pending)."""
        return self._prepared.seconds if self._prepared is not None else None

    def close(self) -> None:
        # Dropping the references unmaps each mapping as soon as no view holds it.
        self._arrays, self._tensors, self._prepared = {}, {}, None
        self._regions, self._scratch = [], None
