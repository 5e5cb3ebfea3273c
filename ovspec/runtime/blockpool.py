"""Continuous batching's KV memory: one set of block arrays shared by every sequence of a
batch, a free list of block ids, and a reservation grown rung by rung (the ladder's rungs,
then doubling up to the budget) when the live sequences together need more blocks.
"""

from __future__ import annotations

import math
import time

import numpy as np
import openvino as ov

from ovspec.errors import BadRequestError, LadderError, arg
from ovspec.ladder import Ladder
from ovspec.runtime.blockkv import BLOCK_TOKENS
from ovspec.runtime.kvcache import Migration


def reservation_schedule(ladder: Ladder, budget_tokens: int) -> tuple[int, ...]:
    """The capacities the pool is reserved at, smallest first: the ladder's rungs below
    ``budget_tokens``, then the top rung doubled until the budget, which ends it."""
    if budget_tokens < ladder.top_tokens:
        raise BadRequestError(
            f"a KV budget of {budget_tokens} tokens is under the top rung "
            f"{ladder.top_tokens}: one sequence could not reach it; raise {arg('kv_budget_tokens')}"
        )
    rungs = [c for c in ladder if c < budget_tokens]
    while rungs and rungs[-1] * 2 < budget_tokens:
        rungs.append(rungs[-1] * 2)
    rungs.append(budget_tokens)
    return tuple(rungs)


def blocks_for(tokens: int) -> int:
    return math.ceil(tokens / BLOCK_TOKENS)


class BlockPool:
    """Block arrays ``[blocks, ...]`` (one per cache input, typed as the graph wants) that
    sequences take blocks from and give back. Block ids stay valid across growth: growing
    copies every block to the same index of larger arrays, so no page table changes."""

    def __init__(
        self, layouts: dict[str, tuple[ov.Shape, ov.Type]], schedule_tokens: tuple[int, ...]
    ) -> None:
        self._layouts = layouts
        self.schedule_tokens = schedule_tokens
        self.capacity_tokens = schedule_tokens[0]
        self._arrays = self._allocate(blocks_for(self.capacity_tokens))
        self._free = list(range(len(next(iter(self._arrays.values())))))[::-1]
        # Counts reallocations: tensors bound before a change point at freed memory.
        self.arrays_version = 0

    def _allocate(self, blocks: int) -> dict[str, np.ndarray]:
        return {
            name: np.zeros((blocks, math.prod(dims) * kind.bitwidth // 8), np.uint8)
            for name, (dims, kind) in self._layouts.items()
        }

    @property
    def total_blocks(self) -> int:
        return blocks_for(self.capacity_tokens)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - len(self._free)

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def tensors(self) -> dict[str, ov.Tensor]:
        """The arrays as the graph's cache inputs (rebind after every growth)."""
        return {
            name: ov.Tensor(array, ov.Shape([len(array), *self._layouts[name][0]]), kind)
            for name, array in self._arrays.items()
            for kind in (self._layouts[name][1],)
        }

    def take(self, count: int) -> tuple[list[int], Migration | None]:
        """``count`` free block ids, growing the reservation first when too few are free
        (the migration, or None); a pool at its budget refuses with ``LadderError``."""
        migration = None
        if count > len(self._free):
            needed = (self.used_blocks + count) * BLOCK_TOKENS
            fitting = [c for c in self.schedule_tokens if c >= needed]
            if not fitting:
                raise LadderError(
                    f"{count} more KV blocks do not fit the budget of "
                    f"{self.schedule_tokens[-1]} tokens ({self.used_blocks} blocks in use)"
                )
            migration = self._grow(fitting[0])
        taken = [self._free.pop() for _ in range(count)]
        return taken, migration

    def give_back(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))
        if self.used_blocks == 0 and self.capacity_tokens != self.schedule_tokens[0]:
            self._shrink()

    def _grow(self, capacity_tokens: int) -> Migration:
        began = time.perf_counter()
        old, old_bytes, old_blocks = self._arrays, self.reserved_bytes, self.total_blocks
        new = self._allocate(blocks_for(capacity_tokens))
        for name, array in old.items():
            new[name][:old_blocks] = array
        copy_s = time.perf_counter() - began
        self._arrays = new
        self.arrays_version += 1
        del old
        allocated = self.reserved_bytes
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=self.used_blocks * BLOCK_TOKENS,
            copied_bytes=old_bytes,
            allocated_bytes=allocated,
            seconds=time.perf_counter() - began,
            peak_reserved_bytes=old_bytes + allocated,
            copy_seconds=copy_s,
        )
        self._free = list(range(blocks_for(capacity_tokens) - 1, old_blocks - 1, -1)) + self._free
        self.capacity_tokens = capacity_tokens
        return migration

    def _shrink(self) -> None:
        """Back to the first rung once no sequence holds a block (nothing to copy)."""
        self.capacity_tokens = self.schedule_tokens[0]
        self._arrays = self._allocate(self.total_blocks)
        self.arrays_version += 1
        self._free = list(range(self.total_blocks))[::-1]

    def close(self) -> None:
        self._arrays = {}
        self._free = []

    def check(self) -> list[str]:
        """Problems with the free list (ids out of range or listed twice); empty when sound."""
        problems = []
        if len(set(self._free)) != len(self._free):
            problems.append("a block id is free twice")
        if any(not 0 <= b < self.total_blocks for b in self._free):
            problems.append("a free block id is outside the pool")
        return problems
