"""The deadline model of one-ahead compilation: where a ladder would stall, and why.

Owns per-rung costs (compile and decode seconds, parsed from flags), the simulation
of the loader's one background worker under the shared early-start rule
(``schedule``), the ``WindowPlan`` the loader consumes, and the one-line conclusion.
Costs from the store or a measurement are ``costs``'s job. Never loads OpenVINO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ovspec.errors import BadRequestError, arg
from ovspec.ladder import Ladder
from ovspec.runtime.schedule import EarlyStartRule, WindowPlan, successors_to_start

# -- costs ------------------------------------------------------------------------------


def _check_seconds(what: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise BadRequestError(f"{what} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class RungCosts:
    """What each rung costs: the time to have its decode program ready (build +
    import), and the time per decode step on it (it grows with the capacity: the
    graph attends over all of it). The first rung's prefill graph loads in front while
    its decode graph loads on the worker; running the prompt delays the first decode
    step, which is when the first successor is queued (0: unknown).

    ``fetch_s``: rungs a remote tier holds, and the time to fetch (bytes / measured
    bandwidth) and import each instead: the loader prefers a fetch to a compile, so
    such a rung costs its fetch (``ready_s``)."""

    compile_s: Mapping[int, float]
    decode_s_per_token: Mapping[int, float]
    prefill_compile_s: float = 0.0
    prefill_s: float = 0.0
    fetch_s: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rung, seconds in self.fetch_s.items():
            _check_seconds(f"fetch time of rung {rung}", seconds)
        object.__setattr__(self, "fetch_s", dict(sorted(self.fetch_s.items())))
        for rung, seconds in self.compile_s.items():
            _check_seconds(f"compile time of rung {rung}", seconds)
        for rung, seconds in self.decode_s_per_token.items():
            _check_seconds(f"decode time per token of rung {rung}", seconds)
        _check_seconds("prefill compile time", self.prefill_compile_s)
        _check_seconds("prefill time", self.prefill_s)
        object.__setattr__(self, "compile_s", dict(sorted(self.compile_s.items())))
        object.__setattr__(
            self, "decode_s_per_token", dict(sorted(self.decode_s_per_token.items()))
        )

    def ready_s(self) -> dict[int, float]:
        """Seconds to have each rung's decode program ready: its fetch when a remote
        holds it, else its compile."""
        return dict(sorted({**self.compile_s, **self.fetch_s}.items()))


@dataclass(frozen=True)
class RungValues:
    """A number per rung from a flag (``1024=0.8,2K=1.0``), one number for every rung
    (``0.8``), or both (``0.8,8192=2.5``: 8192 gets 2.5, the others 0.8)."""

    per_rung: Mapping[int, float] = field(default_factory=dict)
    default: float | None = None

    @classmethod
    def parse(cls, text: str, flag: str) -> RungValues:
        per_rung: dict[int, float] = {}
        default: float | None = None
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise BadRequestError(f"malformed {flag} {text!r}; expected e.g. 1024=0.8,2048=1.0")
        for part in parts:
            rung_text, sep, value_text = part.partition("=")
            value = _parse_number(value_text if sep else rung_text, flag, part)
            if not sep:
                if default is not None:
                    raise BadRequestError(
                        f"{flag} {text!r} gives two values for every rung; give one"
                    )
                default = value
                continue
            rung = _parse_rung(rung_text.strip(), flag, part)
            if rung in per_rung:
                raise BadRequestError(f"{flag} {text!r} names rung {rung} twice")
            per_rung[rung] = value
        return cls(per_rung, default)

    def resolve(self, rungs: Sequence[int], ladder: Ladder, flag: str) -> dict[int, float]:
        """The value of each of ``rungs``; every rung named must be on ``ladder``."""
        stray = sorted(set(self.per_rung) - set(ladder))
        if stray:
            raise BadRequestError(
                f"{flag} names rung {', '.join(map(str, stray))}, not on the ladder {ladder}"
            )
        missing = [r for r in rungs if r not in self.per_rung and self.default is None]
        if missing:
            raise BadRequestError(
                f"{flag} has no value for rung {', '.join(map(str, missing))}; give "
                "RUNG=VALUE for each, or one value for every rung"
            )
        out: dict[int, float] = {}
        for rung in ladder:
            value = self.per_rung.get(rung, self.default)
            if value is not None:
                out[rung] = value
        return out


MAX_RUNG_VALUE = 1e6  # a compile second or decode millisecond past this is a typo (issue 29)


def _parse_number(text: str, flag: str, part: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise BadRequestError(f"{flag} entry {part!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_RUNG_VALUE:
        raise BadRequestError(f"{flag} entry {part!r} must be a finite number >= 0 and <= 1e6")
    return value


def _parse_rung(text: str, flag: str, part: str) -> int:
    scale, digits = (1024, text[:-1]) if text[-1:] in ("k", "K") else (1, text)
    if not digits.isdigit() or int(digits) == 0:
        raise BadRequestError(f"{flag} entry {part!r} does not name a rung (e.g. 1024=0.8)")
    return int(digits) * scale


# -- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduledCompile:
    """One successor compile on the simulated worker."""

    capacity_tokens: int
    queued_at_capacity_tokens: int  # the rung being entered when it was queued
    queued_s: float
    start_s: float
    ready_s: float
    early_reason: str  # why it was queued before its one-ahead turn; "" if it was not
    used: bool  # the request reaches this rung (False: speculative work)

    @property
    def started_early(self) -> bool:
        return bool(self.early_reason)


@dataclass(frozen=True)
class BoundaryPlan:
    """One boundary on the simulated timeline (seconds since the request began)."""

    from_capacity_tokens: int
    to_capacity_tokens: int
    window_tokens: int  # decode steps on the from-rung
    window_s: float  # T_decode(window); the first rung's also runs the prompt
    compile_s: float  # T_compile(to-rung): build + import, or its fetch + import
    start_s: float  # the worker starts compiling the to-rung
    ready_s: float
    boundary_s: float  # decode reaches the boundary
    early_reason: str = ""  # "" unless the to-rung was queued before its one-ahead turn
    fetched: bool = False  # the to-rung comes from a remote tier (``compile_s`` is its fetch)

    def __post_init__(self) -> None:
        if self.to_capacity_tokens <= self.from_capacity_tokens:
            raise ValueError(
                f"boundary {self.from_capacity_tokens}->{self.to_capacity_tokens} goes down"
            )
        if self.window_tokens < 0:
            raise ValueError(f"window of {self.window_tokens} tokens is negative")
        for name in ("window_s", "compile_s", "start_s", "ready_s", "boundary_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"boundary {name} {value!r} is not a finite time >= 0")

    @property
    def slack_s(self) -> float:
        """Boundary minus ready: how long the successor waits for decode (< 0: a stall)."""
        return self.boundary_s - self.ready_s

    @property
    def stalls(self) -> bool:
        return self.slack_s < 0

    @property
    def wait_s(self) -> float:
        return max(0.0, -self.slack_s)

    @property
    def started_early(self) -> bool:
        return bool(self.early_reason)

    @property
    def label(self) -> str:
        return f"{self.from_capacity_tokens}→{self.to_capacity_tokens}"

    @property
    def verdict(self) -> str:
        if self.stalls:
            stall = f"STALL {self.wait_s:.2f} s"
            return f"{stall} (started early: {self.early_reason})" if self.started_early else stall
        return f"early start: {self.early_reason}" if self.started_early else "ok"

    def to_json(self) -> dict[str, object]:
        return {
            "from_capacity_tokens": self.from_capacity_tokens,
            "to_capacity_tokens": self.to_capacity_tokens,
            "window_tokens": self.window_tokens,
            "window_s": self.window_s,
            "compile_s": self.compile_s,
            "start_s": self.start_s,
            "ready_s": self.ready_s,
            "boundary_s": self.boundary_s,
            "slack_s": self.slack_s,
            "stalls": self.stalls,
            "wait_s": self.wait_s,
            "started_early": self.started_early,
            "early_reason": self.early_reason,
            "source": "fetch" if self.fetched else "compile",
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Plan:
    """One request (prompt + new tokens) on a ladder, simulated under one-ahead."""

    ladder: Ladder
    prompt_tokens: int
    new_tokens: int  # decode steps after the prompt, one KV position each
    costs: RungCosts
    early_start: bool
    rule: EarlyStartRule
    foreground_s: float  # until the first rung's programs are ready (built side by side)
    finished_s: float  # the last token
    boundaries: tuple[BoundaryPlan, ...]
    compiles: tuple[ScheduledCompile, ...]  # every successor compile queued, in order
    window_s: Mapping[int, float]  # rung -> decode seconds on it, for every known rung

    @property
    def first_capacity_tokens(self) -> int:
        return self.ladder.rung_for(self.prompt_tokens)

    @property
    def wait_s(self) -> float:
        """Predicted boundary wait, in total."""
        return sum(b.wait_s for b in self.boundaries)

    @property
    def stalls(self) -> tuple[BoundaryPlan, ...]:
        return tuple(b for b in self.boundaries if b.stalls)

    @property
    def speculative(self) -> tuple[ScheduledCompile, ...]:
        """Compiles queued before the request ended for rungs it never reaches."""
        return tuple(c for c in self.compiles if not c.used and c.queued_s <= self.finished_s)

    def to_json(self) -> dict[str, object]:
        return {
            "ladder": list(self.ladder),
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "early_start": self.early_start,
            "rule": self.rule.value if self.early_start else None,
            "first_capacity_tokens": self.first_capacity_tokens,
            "foreground_s": self.foreground_s,
            "finished_s": self.finished_s,
            "wait_s": self.wait_s,
            "stalls": len(self.stalls),
            "boundaries": [b.to_json() for b in self.boundaries],
            "compiles": [
                {
                    "capacity_tokens": c.capacity_tokens,
                    "queued_at_capacity_tokens": c.queued_at_capacity_tokens,
                    "queued_s": c.queued_s,
                    "start_s": c.start_s,
                    "ready_s": c.ready_s,
                    "early_reason": c.early_reason,
                    "used": c.used,
                }
                for c in self.compiles
            ],
        }


def rungs_needed(ladder: Ladder, prompt_tokens: int, new_tokens: int) -> tuple[int, ...]:
    """The rungs a request uses, first to last (raises for one that does not fit)."""
    if prompt_tokens < 1:
        raise BadRequestError(f"{arg('prompt_tokens', str(prompt_tokens))} must be at least 1")
    if new_tokens < 0:
        raise BadRequestError(f"{arg('new_tokens', str(new_tokens))} must not be negative")
    if prompt_tokens + new_tokens > ladder.top_tokens:
        raise BadRequestError(
            f"{prompt_tokens} prompt tokens and {new_tokens} new tokens need "
            f"{prompt_tokens + new_tokens} KV positions, over the top rung {ladder.top_tokens}; "
            f"extend {arg('ladder')} or lower {arg('new_tokens')}"
        )
    first = ladder.rung_for(prompt_tokens)
    last = ladder.rung_for(prompt_tokens + new_tokens)
    return tuple(c for c in ladder if first <= c <= last)


def rung_windows(ladder: Ladder, prompt_tokens: int, costs: RungCosts) -> dict[int, float]:
    """Decode seconds spent on each rung a request passes whole, from the first rung
    up to the one below the top (rungs with no known decode rate are left out). A
    window runs from a rung's first decode step to its boundary: the loader queues
    successors on that step, so the prompt is not in the first rung's window."""
    first = ladder.rung_for(prompt_tokens)
    out: dict[int, float] = {}
    previous = 0
    for rung in ladder:
        if rung >= first and rung != ladder.top_tokens and rung in costs.decode_s_per_token:
            tokens = rung - max(prompt_tokens, previous)
            out[rung] = tokens * costs.decode_s_per_token[rung]
        previous = rung
    return out


def plan_one_ahead(
    ladder: Ladder,
    prompt_tokens: int,
    new_tokens: int,
    costs: RungCosts,
    early_start: bool = True,
    rule: EarlyStartRule = EarlyStartRule.LATEST_START,
) -> Plan:
    """Simulate the loader's single background worker over one request.

    The first rung's prefill graph is built in front while its decode graph is built
    on the worker; the prompt runs once the prefill graph is ready, and the first
    decode step waits for the decode graph. Entering a rung (its first decode step)
    queues its successor, and with ``early_start`` the later rungs ``rule`` picks. The
    worker compiles in queue order, one at a time; decode waits at a boundary until
    the next rung is ready.
    """
    used = rungs_needed(ladder, prompt_tokens, new_tokens)
    ready = costs.ready_s()
    missing_compile = [r for r in used if r not in ready]
    if missing_compile:
        raise BadRequestError(
            f"no compile time for rung {', '.join(map(str, missing_compile))}; "
            f"build it (ovspec build) or give {arg('compile_s')}"
        )
    missing_decode = [r for r in used if r not in costs.decode_s_per_token]
    if missing_decode:
        raise BadRequestError(
            f"no decode rate for rung {', '.join(map(str, missing_decode))}; "
            f"give {arg('decode_s_per_token')} or {arg('measure')}"
        )
    windows = rung_windows(ladder, prompt_tokens, costs)
    active_rule = rule if early_start else None
    first = used[0]
    # The loader builds the first rung's prefill and decode graphs side by side (the
    # decode graph on its worker): a compile keeps about one core busy, so on two or
    # more cores the first rung is ready after the longer of the two.
    foreground_s = max(costs.prefill_compile_s, ready[first])
    # The first decode step: after the prompt, and once the decode graph is in.
    first_step_s = max(costs.prefill_compile_s + costs.prefill_s, ready[first])

    scheduled: dict[int, ScheduledCompile] = {}
    worker_free_s = ready[first]

    def queue(rung: int, entered: int, at_s: float, reason: str) -> None:
        nonlocal worker_free_s
        if rung in scheduled or rung not in ready:
            # Unknown cost: only a rung past the request can lack one, and it sits
            # behind every used rung in the queue, so it delays none of them.
            return
        start_s = max(at_s, worker_free_s)
        ready_s = start_s + ready[rung]
        worker_free_s = ready_s
        scheduled[rung] = ScheduledCompile(
            rung, entered, at_s, start_s, ready_s, reason, rung in used
        )

    boundaries: list[BoundaryPlan] = []
    entry_s = first_step_s
    previous = 0
    finished_s = first_step_s
    for i, rung in enumerate(used):
        for successor, reason in successors_to_start(ladder, rung, ready, windows, active_rule):
            queue(successor, rung, entry_s, reason)
        if i == len(used) - 1:
            tokens = prompt_tokens + new_tokens - max(prompt_tokens, previous)
            finished_s = entry_s + tokens * costs.decode_s_per_token[rung]
            break
        nxt = used[i + 1]
        compile_slot = scheduled[nxt]
        boundary = BoundaryPlan(
            from_capacity_tokens=rung,
            to_capacity_tokens=nxt,
            window_tokens=rung - max(prompt_tokens, previous),
            window_s=windows[rung],
            compile_s=ready[nxt],
            start_s=compile_slot.start_s,
            ready_s=compile_slot.ready_s,
            boundary_s=entry_s + windows[rung],
            early_reason=compile_slot.early_reason,
            fetched=nxt in costs.fetch_s,
        )
        boundaries.append(boundary)
        entry_s = max(boundary.boundary_s, boundary.ready_s)
        previous = rung
    return Plan(
        ladder=ladder,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        costs=costs,
        early_start=early_start,
        rule=rule,
        foreground_s=foreground_s,
        finished_s=finished_s,
        boundaries=tuple(boundaries),
        compiles=tuple(sorted(scheduled.values(), key=lambda c: c.capacity_tokens)),
        window_s=windows,
    )


def window_plan(
    source: Plan | RungCosts, ladder: Ladder | None = None, prompt_tokens: int | None = None
) -> WindowPlan:
    """The predictions the loader starts successors early from: compile seconds of
    every rung, and decode seconds on every rung (from a plan, or from costs with
    the ladder and prompt they apply to)."""
    if isinstance(source, Plan):
        return WindowPlan(
            compile_s=source.costs.ready_s(),
            window_s=dict(source.window_s),
            rule=source.rule,
        )
    if ladder is None or prompt_tokens is None:
        raise BadRequestError("a window plan from costs needs the ladder and the prompt length")
    return WindowPlan(
        compile_s=source.ready_s(), window_s=rung_windows(ladder, prompt_tokens, source)
    )


# -- conclusions ------------------------------------------------------------------------


def _stall_list(stalls: Sequence[BoundaryPlan]) -> str:
    return ", ".join(f"{b.label} by {b.wait_s:.2f} s" for b in stalls)


def _advice(stall: BoundaryPlan) -> str:
    return (
        f"prebuild decode@{stall.to_capacity_tokens} (ovspec build) so it only imports, "
        f"or drop rung {stall.from_capacity_tokens} so the compile of "
        f"{stall.to_capacity_tokens} gets its window too"
    )


def conclusion(one_ahead: Plan, planned: Plan | None = None, better: Plan | None = None) -> str:
    """One line: does one-ahead stall, and does the loader's early start remove it.

    ``one_ahead`` is the plan without early start; ``planned`` the loader's (None:
    early start is off); ``better`` the plan under another rule, named if it removes
    stalls that ``planned`` keeps.
    """
    if not one_ahead.boundaries:
        return f"the request fits rung {one_ahead.first_capacity_tokens}: no boundary to cross"
    if not one_ahead.stalls:
        tight = min(one_ahead.boundaries, key=lambda b: b.slack_s)
        return (
            f"one-ahead is stall-free on this ladder (smallest slack {tight.slack_s:.2f} s "
            f"at {tight.label})"
        )
    head = f"one-ahead would stall at {_stall_list(one_ahead.stalls)}"
    if planned is None or not planned.early_start:
        return f"{head} (early start off); {_advice(one_ahead.stalls[0])}"
    early = [b.to_capacity_tokens for b in planned.boundaries if b.started_early]
    if not early:
        return (
            f"{head}; no later compile can start earlier (each successor is queued as "
            f"soon as the rung before it is entered): {_advice(planned.stalls[0])}"
        )
    named = ", ".join(map(str, early))
    if not planned.stalls:
        it = "it" if len(one_ahead.stalls) == 1 else "them"
        return f"{head}; the loader starts {named} early, which removes {it}"
    line = (
        f"{head}; the loader starts {named} early and still stalls at "
        f"{_stall_list(planned.stalls)}: {_advice(planned.stalls[0])}"
    )
    if better is not None and better.early_start and better.wait_s < planned.wait_s:
        rule = better.rule.value.replace("_", "-")
        it = "it" if len(planned.stalls) == 1 else "them"
        left = f"remove {it}" if not better.stalls else f"leave {better.wait_s:.2f} s of wait"
        line += f" (the {rule} rule would {left})"
    return line
