"""The ``auto`` planning policy: which rungs a request uses, when each build starts and
how many builds run at once, chosen from known costs and the request by simulating
every candidate schedule (``replanning`` revises it at run time). Pure: no OpenVINO,
no clock; ``autorun.AutoLoader`` executes the ``Schedule``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ovspec.errors import BadRequestError, arg
from ovspec.ladder import Ladder
from ovspec.runtime.buildlanes import BuildLanes
from ovspec.runtime.buildlanes import Lanes as Lanes  # re-exported: callers import it here
from ovspec.runtime.plan import BoundaryPlan, RungCosts, rungs_needed
from ovspec.runtime.subladders import sub_ladders, window_tokens

# Predictions this close to the fastest (relative + seconds) tie: more rungs, later starts win.
TIE_RELATIVE, TIE_S = 0.005, 0.005
# The plan prices builds this many times and steps 1/this as long as known: a boundary it
# gives slack survives the drift a re-plan tolerates (``replanning.DRIFT_RATIO``).
GUARD_RATIO = 1.25


class Trigger(Enum):
    """When a rung's build is queued."""

    UPFRONT = "upfront"  # before the prompt, in the foreground
    PREFILL = "prefill"  # as the prompt starts: it builds during the prefill
    ENTER = "enter"  # on entering an earlier rung (its first decode step)


@dataclass(frozen=True)
class Start:
    trigger: Trigger
    at_capacity_tokens: int = 0  # ENTER: the rung whose first step queues the build

    def label(self) -> str:
        if self.trigger is Trigger.ENTER:
            return f"on entering {self.at_capacity_tokens}"
        return "up front" if self.trigger is Trigger.UPFRONT else "during the prefill"


@dataclass(frozen=True)
class AutoCosts:
    """What the policy knows: per rung, the seconds to have its decode graph ready
    (build + import, or a fetch) and per decode step; the prompt rung's prefill graph
    (``prefill_ready_s``) and prompt run (``prefill_s``), scaled for a bigger start
    rung by its build and step ratios unless given; and ``interference``: the fraction
    of a background build's overlap with decoding that the decode is slowed by."""

    ready_s: Mapping[int, float]
    decode_s_per_token: Mapping[int, float]
    prefill_ready_s: Mapping[int, float] = field(default_factory=dict)
    prefill_s: Mapping[int, float] = field(default_factory=dict)
    interference: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ready_s", "decode_s_per_token", "prefill_ready_s", "prefill_s"):
            values: Mapping[int, float] = getattr(self, name)
            for rung, seconds in values.items():
                if not (math.isfinite(seconds) and seconds >= 0):
                    raise BadRequestError(f"{name} of rung {rung} is {seconds!r}: not a time")
            object.__setattr__(self, name, dict(sorted(values.items())))
        if not (math.isfinite(self.interference) and 0 <= self.interference <= 10):
            raise BadRequestError(f"interference {self.interference!r} is not in [0, 10]")

    @classmethod
    def from_rung_costs(
        cls, costs: RungCosts, prompt_rung: int, interference: float = 0.0
    ) -> AutoCosts:
        return cls(
            ready_s=costs.ready_s(),
            decode_s_per_token=costs.decode_s_per_token,
            prefill_ready_s={prompt_rung: costs.prefill_compile_s},
            prefill_s={prompt_rung: costs.prefill_s},
            interference=interference,
        )

    def to_json(self) -> dict[str, object]:
        maps = ("ready_s", "decode_s_per_token", "prefill_ready_s", "prefill_s")
        out: dict[str, object] = {n: {str(r): v for r, v in getattr(self, n).items()} for n in maps}
        return {**out, "interference": self.interference}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AutoCosts:
        def rungs(name: str) -> dict[int, float]:
            return {int(r): float(v) for r, v in data.get(name, {}).items()}

        return cls(
            rungs("ready_s"),
            rungs("decode_s_per_token"),
            rungs("prefill_ready_s"),
            rungs("prefill_s"),
            float(data.get("interference", 0.0)),
        )

    def knows(self, rung: int) -> bool:
        return rung in self.ready_s and rung in self.decode_s_per_token

    def prefill_ready(self, rung: int) -> float:
        return _scaled(self.prefill_ready_s, self.ready_s, rung)

    def prefill_run(self, rung: int) -> float:
        return _scaled(self.prefill_s, self.decode_s_per_token, rung)

    def scaled(self, build: float, decode: float) -> AutoCosts:
        """Builds ``build`` times and steps ``decode`` times as long (a drift)."""
        return AutoCosts(
            {r: s * build for r, s in self.ready_s.items()},
            {r: s * decode for r, s in self.decode_s_per_token.items()},
            {r: s * build for r, s in self.prefill_ready_s.items()},
            {r: s * decode for r, s in self.prefill_s.items()},
            self.interference,
        )


def _scaled(known: Mapping[int, float], ratio_by: Mapping[int, float], rung: int) -> float:
    """``known[rung]``, else the nearest known rung's value times ``ratio_by``'s ratio."""
    if rung in known:
        return known[rung]
    if not known:
        return 0.0
    base = min(known, key=lambda r: abs(r - rung))
    if ratio_by.get(base) and rung in ratio_by:
        return known[base] * ratio_by[rung] / ratio_by[base]
    return known[base]


@dataclass(frozen=True)
class Request:
    """What the request says: its prompt, the most tokens it may decode, and whether a
    stop condition (EOS, stop ids or strings, a streamer) may end it sooner."""

    prompt_tokens: int
    new_tokens: int
    may_stop_early: bool = False

    @property
    def reachable_tokens(self) -> int:
        """The most KV positions the request can use: no build is needed past them."""
        return self.prompt_tokens + self.new_tokens


def reachable_rungs(ladder: Ladder, request: Request) -> tuple[int, ...]:
    """The rungs a request can reach, first to last (the cap on what is worth building)."""
    return rungs_needed(ladder, request.prompt_tokens, request.new_tokens)


@dataclass(frozen=True)
class Schedule:
    """What the loader does for one request: the rungs it decodes on (a sub-ladder of the
    reachable ones; the first runs the prompt), when each later rung's build is queued,
    and how many builds its worker runs at once."""

    rungs: tuple[int, ...]
    starts: Mapping[int, Start]  # every rung after the first
    lanes: int = 1
    name: str = ""  # e.g. "one ahead", "up front"

    def __post_init__(self) -> None:
        if not self.rungs or list(self.rungs) != sorted(set(self.rungs)):
            raise BadRequestError(f"schedule rungs {self.rungs} are not strictly increasing")
        if set(self.starts) != set(self.rungs[1:]):
            raise BadRequestError(f"schedule {self.rungs} lacks a start for some rung")
        for rung, start in self.starts.items():
            if start.trigger is Trigger.ENTER and not (
                start.at_capacity_tokens in self.rungs and start.at_capacity_tokens < rung
            ):
                raise BadRequestError(f"rung {rung} is queued on a rung it does not follow")
        object.__setattr__(self, "starts", dict(sorted(self.starts.items())))

    @property
    def ladder(self) -> Ladder:
        return Ladder(self.rungs)

    def upfront(self) -> tuple[int, ...]:
        return tuple(r for r, s in self.starts.items() if s.trigger is Trigger.UPFRONT)

    def at_prompt(self) -> tuple[int, ...]:
        return tuple(r for r, s in self.starts.items() if s.trigger is Trigger.PREFILL)

    def on_entering(self, capacity_tokens: int) -> tuple[int, ...]:
        return tuple(
            r
            for r, s in self.starts.items()
            if s.trigger is Trigger.ENTER and s.at_capacity_tokens == capacity_tokens
        )

    def lead_rungs(self) -> int:
        """How far ahead builds are queued: 1 one-ahead, 2 two-ahead (the most over
        rungs); upfront and prefill count as the whole ladder."""
        index = {r: i for i, r in enumerate(self.rungs)}
        leads = [
            index[r] - index[s.at_capacity_tokens] if s.trigger is Trigger.ENTER else len(index)
            for r, s in self.starts.items()
        ]
        return max(leads, default=0)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "rungs": list(self.rungs),
            "lanes": self.lanes,
            "starts": {str(r): s.label() for r, s in self.starts.items()},
        }


def ahead(rungs: Sequence[int], lead: int, lanes: int = 1) -> Schedule:
    """Entering a rung queues the builds ``lead`` rungs ahead (1: one-ahead); the first
    rung's first step queues the first ``lead``."""
    starts = {
        r: Start(Trigger.ENTER, rungs[max(0, i - lead)]) for i, r in enumerate(rungs) if i > 0
    }
    name = {1: "one ahead", 2: "two ahead"}.get(lead, f"{lead} ahead")
    return Schedule(tuple(rungs), starts, lanes, name)


def all_at(rungs: Sequence[int], trigger: Trigger, lanes: int = 1) -> Schedule:
    """Every later rung queued up front or as the prompt starts."""
    name = "up front" if trigger is Trigger.UPFRONT else "during the prefill"
    return Schedule(tuple(rungs), {r: Start(trigger) for r in rungs[1:]}, lanes, name)


# -- the simulation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """One schedule simulated over one request (seconds since the loader opened)."""

    schedule: Schedule
    foreground_s: float  # the prompt can run
    first_step_s: float
    finished_s: float  # the last token: the critical path
    boundaries: tuple[BoundaryPlan, ...]
    build_s: Mapping[int, tuple[float, float]]  # rung -> (start, ready) of its decode graph

    @property
    def wait_s(self) -> float:
        return sum(b.wait_s for b in self.boundaries)

    def to_json(self) -> dict[str, object]:
        return {
            "schedule": self.schedule.to_json(),
            "foreground_s": self.foreground_s,
            "first_step_s": self.first_step_s,
            "finished_s": self.finished_s,
            "wait_s": self.wait_s,
            "boundaries": [b.to_json() for b in self.boundaries],
        }


def simulate(schedule: Schedule, costs: AutoCosts, request: Request, lanes: Lanes) -> Timeline:
    """The loader's run of ``schedule``: the prompt rung's prefill graph, its decode graph
    and the up-front rungs on the foreground lanes; the prompt once the prefill graph
    (and every up-front rung) is ready; queued builds first in, first out on the
    schedule's lanes; decode slowed by ``interference`` while a build overlaps it; a wait
    at a boundary whose rung is not ready."""
    rungs = schedule.rungs
    first = rungs[0]
    fg = BuildLanes([0.0] * lanes.foreground)
    _, prefill_ready = fg.run(0.0, costs.prefill_ready(first))
    built: dict[int, tuple[float, float]] = {first: fg.run(0.0, costs.ready_s[first])}
    upfront = schedule.upfront()
    for rung in upfront:
        built[rung] = fg.run(0.0, costs.ready_s[rung])
    foreground_s = max([prefill_ready, *(built[r][1] for r in upfront)])
    if upfront:
        foreground_s = max(foreground_s, built[first][1])  # an eager start waits for all
    # The busiest lanes carry over into the decode (the worker still loads the first rung).
    carried = sorted(fg.free_s, reverse=True)[: schedule.lanes]
    bg = BuildLanes(carried + [0.0] * (schedule.lanes - len(carried)))
    first_step_s = max(foreground_s + costs.prefill_run(first), built[first][1])
    for rung in schedule.at_prompt():
        built[rung] = bg.run(foreground_s, costs.ready_s[rung])
    boundaries: list[BoundaryPlan] = []
    entry_s = first_step_s
    end_tokens = request.reachable_tokens
    for i, rung in enumerate(rungs):
        for queued in schedule.on_entering(rung):
            built[queued] = bg.run(entry_s, costs.ready_s[queued])
        tokens = window_tokens(rungs, i, request.prompt_tokens, end_tokens)
        window_s = slowed(tokens * costs.decode_s_per_token[rung], entry_s, built, costs)
        if i == len(rungs) - 1:
            return Timeline(
                schedule, foreground_s, first_step_s, entry_s + window_s, tuple(boundaries), built
            )
        nxt = rungs[i + 1]
        start_s, ready_s = built[nxt]
        start = schedule.starts[nxt]
        boundary = BoundaryPlan(
            from_capacity_tokens=rung,
            to_capacity_tokens=nxt,
            window_tokens=tokens,
            window_s=window_s,
            compile_s=costs.ready_s[nxt],
            start_s=start_s,
            ready_s=ready_s,
            boundary_s=entry_s + window_s,
            early_reason="" if start == Start(Trigger.ENTER, rung) else start.label(),
        )
        boundaries.append(boundary)
        entry_s = max(boundary.boundary_s, ready_s)
    raise AssertionError("unreachable: the last rung returns")


def slowed(
    decode_s: float, entry_s: float, built: Mapping[int, tuple[float, float]], costs: AutoCosts
) -> float:
    """A window's decode time, lengthened by the builds that overlap it."""
    if costs.interference <= 0:
        return decode_s
    end_s = entry_s + decode_s
    overlap = sum(max(0.0, min(end_s, b) - max(entry_s, a)) for a, b in built.values())
    return decode_s + costs.interference * overlap


# -- the choice -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The chosen schedule, its predicted timeline, the fixed policies' predictions beside
    it (B0: the top reachable rung only; I1: every rung up front; I2: one ahead), and why."""

    request: Request
    chosen: Timeline
    fixed: Mapping[str, Timeline]
    reasons: tuple[str, ...]
    candidates: int

    @property
    def schedule(self) -> Schedule:
        return self.chosen.schedule

    def best_fixed(self) -> tuple[str, Timeline]:
        return min(self.fixed.items(), key=lambda kv: kv[1].finished_s)

    def to_json(self) -> dict[str, object]:
        name, best = self.best_fixed()
        return {
            "prompt_tokens": self.request.prompt_tokens,
            "new_tokens": self.request.new_tokens,
            "may_stop_early": self.request.may_stop_early,
            "schedule": self.schedule.to_json(),
            "predicted": self.chosen.to_json(),
            "fixed": {k: v.to_json() for k, v in self.fixed.items()},
            "best_fixed": name,
            "predicted_gain_s": best.finished_s - self.chosen.finished_s,
            "reasons": list(self.reasons),
            "candidates": self.candidates,
        }


def _timings(rungs: tuple[int, ...], lanes: int, may_stop_early: bool) -> list[Schedule]:
    if len(rungs) == 1:
        return [Schedule(rungs, {}, 1, "one rung")]
    out = [ahead(rungs, lead, lanes) for lead in range(1, len(rungs))]
    out.append(all_at(rungs, Trigger.PREFILL, lanes))
    if not may_stop_early:  # up-front work is lost if the request stops on its first rung
        out.append(all_at(rungs, Trigger.UPFRONT, lanes))
    return out


def _bound_s(rungs: tuple[int, ...], costs: AutoCosts, request: Request, lanes: Lanes) -> float:
    """No schedule on ``rungs`` ends sooner: its first rung's graphs built side by side,
    the prompt, then every window's steps with no wait and no slowdown; nor before every
    build, spread over the most lanes, is done and the last window decoded."""
    first = rungs[0]
    ready = max(costs.prefill_ready(first) + costs.prefill_run(first), costs.ready_s[first])
    windows = [
        window_tokens(rungs, i, request.prompt_tokens, request.reachable_tokens)
        * costs.decode_s_per_token[r]
        for i, r in enumerate(rungs)
    ]
    builds = costs.prefill_ready(first) + sum(costs.ready_s[r] for r in rungs)
    most = max(lanes.foreground, lanes.background)
    return max(ready + sum(windows), builds / most + windows[-1])


def _lateness(schedule: Schedule) -> tuple[int, int, int]:
    """Tie-break among equally fast schedules: more rungs, later starts, fewer lanes."""
    return (-len(schedule.rungs), schedule.lead_rungs(), schedule.lanes)


def fixed_policies(
    reachable: Sequence[int], costs: AutoCosts, request: Request, lanes: Lanes
) -> dict[str, Timeline]:
    """B0, I1 and I2 as this model predicts them (B0 on the top reachable rung)."""
    full = tuple(reachable)
    return {
        "B0": simulate(Schedule((full[-1],), {}, 1, "one rung"), costs, request, lanes),
        "I1": simulate(all_at(full, Trigger.UPFRONT), costs, request, lanes),
        "I2": simulate(ahead(full, 1), costs, request, lanes),
    }


def choose(
    ladder: Ladder, request: Request, known: AutoCosts, lanes: Lanes, guard: float = GUARD_RATIO
) -> Decision:
    """The fastest predicted schedule for ``request`` over the rungs it can reach, every
    candidate priced with builds ``guard`` times and steps 1/``guard`` as long as
    ``known`` (a thin slack is a predicted wait); ties (within ``TIE_RELATIVE``/``TIE_S``)
    go to more rungs, later starts, fewer lanes."""
    costs = known.scaled(guard, 1 / guard)
    reachable = reachable_rungs(ladder, request)
    unknown = [r for r in reachable if not costs.knows(r)]
    if unknown:
        raise BadRequestError(
            f"auto has no cost for rung {', '.join(map(str, unknown))}; build the ladder "
            f"(ovspec build), run `ovspec plan --measure`, or give {arg('policy', 'one_ahead')}"
        )
    timelines: list[Timeline] = []
    best_s = math.inf
    # Fastest bound first, and a sub-ladder whose bound cannot tie the best is not simulated.
    for bound_s, rungs in sorted(
        (_bound_s(r, costs, request, lanes), r) for r in sub_ladders(reachable)
    ):
        if bound_s > best_s * (1 + TIE_RELATIVE) + TIE_S:
            break
        for n in range(1, lanes.background + 1):
            if n > 1 and len(rungs) <= 2:  # a second lane needs two builds to overlap
                continue
            for schedule in _timings(rungs, n, request.may_stop_early):
                timelines.append(simulate(schedule, costs, request, lanes))
                best_s = min(best_s, timelines[-1].finished_s)
    tied = [t for t in timelines if t.finished_s <= best_s * (1 + TIE_RELATIVE) + TIE_S]
    chosen = min(tied, key=lambda t: (_lateness(t.schedule), t.finished_s))
    fixed = fixed_policies(reachable, costs, request, lanes)
    return Decision(
        request, chosen, fixed, explain(chosen, fixed, reachable, costs, guard), len(timelines)
    )


def explain(
    chosen: Timeline,
    fixed: Mapping[str, Timeline],
    reachable: Sequence[int],
    costs: AutoCosts,
    guard: float = GUARD_RATIO,
) -> tuple[str, ...]:
    """Why, in a line per decision: skipped rungs, a bigger start, when builds start,
    lanes, and the prediction against the best fixed policy."""
    schedule, one_ahead = chosen.schedule, fixed["I2"]
    waits = {b.to_capacity_tokens: b for b in one_ahead.boundaries}
    out: list[str] = []
    skipped = [r for r in reachable if r not in schedule.rungs]
    if reachable[0] not in schedule.rungs:
        out.append(
            f"starts on {schedule.rungs[0]} instead of {reachable[0]}: a longer prompt "
            f"rung costs less than waiting for builds it cannot hide"
        )
    for rung in skipped[1:] if reachable[0] in skipped else skipped:
        b = waits.get(rung)
        why = (
            f"its build ({b.compile_s:.2f} s) does not hide in the {b.window_s:.2f} s window "
            f"before it (one ahead waits {b.wait_s:.2f} s there)"
            if b is not None and b.stalls
            else f"building it ({costs.ready_s[rung]:.2f} s) delays the rungs after it"
        )
        out.append(f"skips {rung}: {why}")
    if len(schedule.rungs) > 1:
        tight = min(chosen.boundaries, key=lambda b: b.slack_s)
        out.append(
            f"builds start {schedule.name}: predicted slack {tight.slack_s:+.2f} s at its "
            f"tightest boundary ({tight.label}), {chosen.wait_s:.2f} s of wait in all"
        )
    if schedule.lanes > 1:
        out.append(f"{schedule.lanes} builds at once: later rungs' builds overlap")
    name, best = min(fixed.items(), key=lambda kv: kv[1].finished_s)
    out.append(
        f"guarded: builds priced at {guard:g}x and steps at 1/{guard:g} of the known costs "
        f"(the drift a re-plan tolerates), so a thinner slack counts as a wait"
    )
    out.append(
        f"predicted last token {chosen.finished_s:.2f} s against {best.finished_s:.2f} s for "
        f"the best fixed policy ({name})"
    )
    return tuple(out)
