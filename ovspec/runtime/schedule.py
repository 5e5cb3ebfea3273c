"""The early-start rule one-ahead shares with its deadline plan.

Entering a rung queues its successor; a rule may queue later rungs too when their
compile cannot wait for their turn. The loader applies it and ``ovspec plan``
simulates it, so the plan's predictions are the loader's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ovspec.ladder import Ladder


class EarlyStartRule(Enum):
    """When entering a rung, which later rungs (beyond the next) to queue as well.

    WINDOW is the loader's rule today (``Loader._successors_to_queue``): rung j joins
    the queue while its compile is longer than the window of the rung before it.
    LATEST_START queues every rung whose latest feasible start, given the serial
    worker and every later deadline, falls before the next boundary.
    """

    WINDOW = "window"
    LATEST_START = "latest_start"


@dataclass(frozen=True)
class WindowPlan:
    """Per-rung predictions the loader uses to start a successor early."""

    compile_s: dict[int, float]  # successor capacity -> predicted build + import seconds
    window_s: dict[int, float]  # rung capacity -> predicted decode seconds spent on it
    rule: EarlyStartRule = EarlyStartRule.LATEST_START


def successors_to_start(
    ladder: Ladder,
    capacity_tokens: int,
    compile_s: Mapping[int, float],
    window_s: Mapping[int, float],
    rule: EarlyStartRule | None,
) -> list[tuple[int, str]]:
    """What entering ``capacity_tokens`` queues, in order: the next rung (note ""), and
    under ``rule`` later rungs with the reason they start early. ``None``: one-ahead
    only. Rungs with no prediction stop the look-ahead, as in the loader."""
    nxt = ladder.successor(capacity_tokens)
    if nxt is None:
        return []
    out: list[tuple[int, str]] = [(nxt, "")]
    if rule is EarlyStartRule.WINDOW:
        # Keep in step with Loader._successors_to_queue (tests/test_plan.py checks it).
        while True:
            after = ladder.successor(nxt)
            if after is None:
                break
            need = compile_s.get(after)
            have = window_s.get(nxt)
            if need is None or have is None or need <= have:
                break
            out.append(
                (
                    after,
                    f"window of rung {nxt} ({have:.2f} s) is shorter than the "
                    f"compile of {after} ({need:.2f} s)",
                )
            )
            nxt = after
    elif rule is EarlyStartRule.LATEST_START:
        out.extend(_latest_start_early(ladder, capacity_tokens, compile_s, window_s))
    return out


def _latest_start_early(
    ladder: Ladder,
    capacity_tokens: int,
    compile_s: Mapping[int, float],
    window_s: Mapping[int, float],
) -> list[tuple[int, str]]:
    # Deadlines relative to entering this rung: the boundary into each later rung.
    chain: list[int] = []
    deadline_s: list[float] = []
    at_s = 0.0
    rung: int | None = capacity_tokens
    while rung is not None:
        after = ladder.successor(rung)
        if after is None or rung not in window_s or after not in compile_s:
            break
        at_s += window_s[rung]
        chain.append(after)
        deadline_s.append(at_s)
        rung = after
    # Latest starts, backwards: one worker, so each compile must also end before
    # the next one's latest start.
    latest_s = [0.0] * len(chain)
    bound_s = math.inf
    for k in range(len(chain) - 1, -1, -1):
        latest_s[k] = min(deadline_s[k], bound_s) - compile_s[chain[k]]
        bound_s = latest_s[k]
    if not chain:
        return []
    next_decision_s = window_s[capacity_tokens]
    out: list[tuple[int, str]] = []
    # Latest starts never decrease along the chain, so the early ones are a prefix.
    for k in range(1, len(chain)):
        if latest_s[k] >= next_decision_s:
            break
        out.append(
            (
                chain[k],
                _start_reason(chain[k], capacity_tokens, latest_s[k], next_decision_s),
            )
        )
    return out


def _start_reason(rung: int, entered: int, latest_s: float, boundary_s: float) -> str:
    """Why a rung starts early, in words: a negative latest start means already late."""
    if latest_s < 0:
        when = f"is already {-latest_s:.2f} s late on entering rung {entered}"
    else:
        when = f"must start within {latest_s:.2f} s of entering rung {entered}"
    return f"compile of {rung} {when}, before the boundary at {boundary_s:.2f} s"


def reachable_top_tokens(ladder: Ladder, reachable_tokens: int | None) -> int:
    """The rung that holds ``reachable_tokens`` KV positions (None, or more than the
    ladder holds: its top): no request needs a rung above it."""
    if reachable_tokens is None or reachable_tokens >= ladder.top_tokens:
        return ladder.top_tokens
    return ladder.rung_for(max(reachable_tokens, 1))
