"""Re-planning ``auto``'s schedule while it runs: how far measured builds and decode
steps drift from the plan's costs, which later builds to queue now when they do, and
which queued builds a request that ended early abandons. Pure, like ``autopolicy``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ovspec.runtime.autopolicy import (
    GUARD_RATIO,
    TIE_RELATIVE,
    TIE_S,
    AutoCosts,
    Request,
    Schedule,
    slowed,
)
from ovspec.runtime.buildlanes import BuildLanes
from ovspec.runtime.subladders import window_tokens

# A measured build or decode this far from the plan's (ratio) triggers a re-plan; below
# it the plan's guard covers the drift.
DRIFT_RATIO = GUARD_RATIO


@dataclass(frozen=True)
class Observed:
    """What the loader measured so far: each finished build's seconds (ready - start)
    and the decode seconds per token of each rung it has left."""

    ready_s: Mapping[int, float] = field(default_factory=dict)
    decode_s_per_token: Mapping[int, float] = field(default_factory=dict)


def drift(costs: AutoCosts, observed: Observed) -> tuple[float, float]:
    """(build, decode) ratios of measured to predicted times (medians; 1.0 when unknown)."""

    def ratio(measured: Mapping[int, float], predicted: Mapping[int, float]) -> float:
        ratios = [m / predicted[r] for r, m in measured.items() if predicted.get(r)]
        return statistics.median(ratios) if ratios else 1.0

    return ratio(observed.ready_s, costs.ready_s), ratio(
        observed.decode_s_per_token, costs.decode_s_per_token
    )


@dataclass(frozen=True)
class Replan:
    """Rungs to queue now, on entering ``at_capacity_tokens``, and why."""

    at_capacity_tokens: int
    queue_now: tuple[int, ...]
    build_ratio: float
    decode_ratio: float
    reason: str


def replan(
    schedule: Schedule,
    costs: AutoCosts,
    request: Request,
    at_capacity_tokens: int,
    pending: Sequence[int],
    loaded: Sequence[int],
    observed: Observed,
    threshold: float = DRIFT_RATIO,
) -> Replan | None:
    """On entering a rung: if measured builds or steps drift past ``threshold`` from the
    plan, re-simulate the rest from this rung's first step (``pending`` builds queued
    ahead, ``loaded`` ones ready, costs scaled by the drift) with more of the later
    builds queued now, and return the earliest-finishing change (ties: fewer builds
    now); None when nothing drifted or the planned starts stay the best."""
    build, decode = drift(costs, observed)
    if max(build, 1 / build, decode, 1 / decode) < threshold:
        return None
    rest = tuple(r for r in schedule.rungs if r >= at_capacity_tokens)
    later = [r for r in rest[1:] if r not in pending and r not in loaded]
    planned_now = [r for r in schedule.on_entering(at_capacity_tokens) if r in later]
    options = [
        planned_now + [r for r in later[:n] if r not in planned_now] for n in range(len(later) + 1)
    ]
    scaled = costs.scaled(build, decode)
    index = schedule.rungs.index(at_capacity_tokens)
    live = request.prompt_tokens if index == 0 else schedule.rungs[index - 1]

    def finish(now: Sequence[int]) -> float:
        lanes = BuildLanes([0.0] * schedule.lanes)
        built = {r: (0.0, 0.0) for r in [rest[0], *loaded]}
        for r in [*pending, *now]:
            if r in rest and r not in built:
                built[r] = lanes.run(0.0, scaled.ready_s[r])
        entry_s = 0.0
        for i, rung in enumerate(rest):
            for r in schedule.on_entering(rung):
                if r not in built:
                    built[r] = lanes.run(entry_s, scaled.ready_s[r])
            tokens = window_tokens(rest, i, live, request.reachable_tokens)
            window = slowed(tokens * scaled.decode_s_per_token[rung], entry_s, built, scaled)
            if i == len(rest) - 1:
                return entry_s + window
            entry_s = max(entry_s + window, built[rest[i + 1]][1])
        return entry_s

    finishes = [finish(now) for now in options]
    best_s = min(finishes)
    pick = next(k for k, s in enumerate(finishes) if s <= best_s * (1 + TIE_RELATIVE) + TIE_S)
    extra = tuple(r for r in options[pick] if r not in planned_now)
    if not extra:
        return None
    return Replan(
        at_capacity_tokens,
        tuple(options[pick]),
        build,
        decode,
        f"builds ran {build:.2f}x and steps {decode:.2f}x the plan's: queue "
        f"{', '.join(map(str, extra))} now (predicted {finishes[pick]:.2f} s to the last "
        f"token from here, against {finishes[0]:.2f} s as planned)",
    )


def abandoned(
    schedule: Schedule, reached_capacity_tokens: int, pending: Sequence[int]
) -> tuple[int, ...]:
    """When a request ends early on ``reached_capacity_tokens``: the pending builds of
    rungs it will never reach, to cancel where they have not started."""
    return tuple(r for r in pending if r > reached_capacity_tokens)
