"""The sub-ladders ``auto`` weighs for a request (the rungs it may skip or start past) and
each window's token count on one; pure arithmetic over rung capacities.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

MAX_SUBSET_RUNGS = 10  # past this many optional rungs: only single skips and bigger starts


def sub_ladders(reachable: Sequence[int]) -> list[tuple[int, ...]]:
    """Every sub-ladder ending on the last reachable rung (all subsets of the others; past
    ``MAX_SUBSET_RUNGS`` optional rungs: a bigger start and single skips)."""
    optional, last = list(reachable[:-1]), reachable[-1]
    if len(optional) <= MAX_SUBSET_RUNGS:
        subsets = itertools.chain.from_iterable(
            itertools.combinations(optional, n) for n in range(len(optional) + 1)
        )
        return [(*s, last) for s in subsets]
    out = {(*optional[k:], last) for k in range(len(optional) + 1)}
    out |= {(*(r for r in optional if r != skip), last) for skip in optional}
    return sorted(out)


def window_tokens(rungs: Sequence[int], index: int, from_tokens: int, end_tokens: int) -> int:
    low = max(from_tokens, rungs[index - 1] if index > 0 else 0)
    high = rungs[index] if index < len(rungs) - 1 else end_tokens
    return max(0, high - low)
