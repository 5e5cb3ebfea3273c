"""The ``auto`` policy at run time: a loader that asks ``autopolicy`` for one request's
schedule, runs it (the rungs it keeps, up-front builds, builds queued as the prompt
starts or on entering a rung, the worker's lanes), re-plans when measured builds or
steps drift, cancels what an early end abandons, and keeps the prediction beside what
happened (its events and ``decision``). Without given costs it plans from the store's
history, and records each request's step times there for the next.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ovspec.compile.compiler import Compiler
from ovspec.errors import BadRequestError
from ovspec.ir.specialize import Phase, Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import (
    AutoCosts,
    Decision,
    Lanes,
    Request,
    Schedule,
    ahead,
    choose,
    reachable_rungs,
)
from ovspec.runtime.costs import history
from ovspec.runtime.loader import EventKind, Loader, Policy
from ovspec.runtime.replanning import Observed, abandoned, replan
from ovspec.runtime.session import StepRecord
from ovspec.runtime.worker import Worker
from ovspec.store.steptimes import record_step_times


@dataclass
class _Progress:
    """What one request has done so far: when each rung was entered, each build's
    seconds (load start to loaded), and the re-plans made."""

    entered_s: dict[int, float] = field(default_factory=dict)
    replans: list[str] = field(default_factory=list)


class AutoLoader(Loader):
    """A ``Loader`` whose policy is ``auto``: ``begin_request`` decides, the rest runs it.

    Without costs (``costs`` None) or with a rung it has no cost for, the schedule is
    one ahead over every reachable rung, and its PLANNED event says why."""

    def __init__(
        self,
        compiler: Compiler,
        ladder: Ladder,
        costs: AutoCosts | None,
        lanes: Lanes,
        **loader_options: Any,
    ) -> None:
        super().__init__(compiler, ladder, Policy.AUTO, **loader_options)
        self.costs = costs
        self.lanes = lanes
        self.decision: Decision | None = None
        self.schedule: Schedule | None = None
        self._request: Request | None = None
        self._progress = _Progress()

    def begin_request(self, prompt_tokens: int, new_tokens: int, may_stop_early: bool) -> Ladder:
        """Choose this request's schedule; returns the ladder its sequence decodes on."""
        request = Request(prompt_tokens, new_tokens, may_stop_early)
        self._request, self._progress = request, _Progress()
        reachable = reachable_rungs(self.ladder, request)
        try:
            if self.costs is None:
                self.costs = self._stored_costs(reachable)
            self.decision = choose(self.ladder, request, self.costs, self.lanes)
            self.schedule = self.decision.schedule
            note = "; ".join(self.decision.reasons)
            predicted = self.decision.chosen.finished_s
        except BadRequestError as exc:
            self.decision, self.schedule = None, ahead(reachable, 1)
            note, predicted = f"one ahead: {exc}", 0.0
        first = Specialization.decode(self.schedule.rungs[0])
        self._record(EventKind.PLANNED, first, True, seconds=predicted, note=note)
        if self.schedule.lanes != self._worker.lanes:
            # Nothing queued yet (start() comes next): a pool of the schedule's lanes.
            self._worker.close((), wait=True, then=lambda: None)
            self._worker = Worker(self.worker_cores, self.schedule.lanes)
        return self.schedule.ladder

    def _stored_costs(self, reachable: tuple[int, ...]) -> AutoCosts:
        """The store's history: builds, imports and step times of past runs; a clear
        error (then one ahead) when a reachable rung lacks one."""
        known = history(self._compiler, self.ladder, reachable, self.prefill_chunk_tokens or 1)
        missing = [r for r in reachable if r not in known.steps]
        if missing:
            raise BadRequestError(
                f"the store has no decode step time for rung {', '.join(map(str, missing))} "
                f"yet (a run on it records one)"
            )
        return known.auto_costs(reachable[0])

    def end_request(self, reached_capacity_tokens: int, steps: Sequence[StepRecord] = ()) -> None:
        """The request ended on ``reached_capacity_tokens``: cancel the queued builds of
        rungs past it that have not started (a started one finishes into the store), and
        record each rung's decode seconds per token (``steps``) and import in the store."""
        self._record_step_times(steps)
        if self.schedule is None:
            return
        with self._lock:
            pending = [s.capacity_tokens for s in self._pending if s.phase is Phase.DECODE]
        for rung in abandoned(self.schedule, reached_capacity_tokens, pending):
            spec = Specialization.decode(rung)
            with self._lock:
                future = self._pending.get(spec)
                if future is not None and future.cancel():
                    del self._pending[spec]
                    cancelled = True
                else:
                    cancelled = False
            if cancelled:
                self._record(EventKind.RELEASED, spec, False, note="cancelled: the request ended")

    def _record_step_times(self, steps: Sequence[StepRecord]) -> None:
        by_rung: dict[int, list[float]] = {}
        for step in steps:
            if not step.prefill:
                by_rung.setdefault(step.capacity_tokens, []).append(step.infer_s)
        runs = {}
        for rung, seconds in by_rung.items():
            spec = Specialization.decode(rung)
            program = self.program(spec)
            import_s = program.import_s if program is not None else 0.0
            # The mean: a window's time is the sum of its steps.
            runs[self._compiler.key(spec).hex] = (spec.label, statistics.fmean(seconds), import_s)
        if runs:
            record_step_times(self._compiler.store.root, runs)

    def _start(self, first_capacity_tokens: int) -> None:
        schedule = self.schedule or ahead((first_capacity_tokens,), 1)
        upfront = [Specialization.decode(r) for r in schedule.upfront()]
        for spec in upfront[1::2]:  # every other one on the worker, as an eager start does
            self._submit(spec, foreground=True)
        super()._start(first_capacity_tokens)
        for spec in upfront:
            self._obtain(spec, record_wait=False)
        for rung in schedule.at_prompt():  # they build while the prompt runs
            self._queue(rung, "queued as the prompt starts")

    def _after_get(self, spec: Specialization) -> None:
        schedule, request = self.schedule, self._request
        if schedule is None or request is None or spec.phase is not Phase.DECODE:
            return
        rung = spec.capacity_tokens
        progress = self._progress
        if rung in progress.entered_s or rung not in schedule.rungs:
            return
        progress.entered_s[rung] = self._clock() - self.origin_s
        for queued in schedule.on_entering(rung):
            index = schedule.rungs.index(queued)
            lead = index - schedule.rungs.index(rung)
            self._queue(queued, f"queued {lead} rungs ahead" if lead > 1 else "")
        if self.costs is None or self.decision is None:
            return
        with self._lock:
            pending = [s.capacity_tokens for s in self._pending if s.phase is Phase.DECODE]
            loaded = [s.capacity_tokens for s in self._programs if s.phase is Phase.DECODE]
        change = replan(
            schedule, self.costs, request, rung, pending, loaded, self._observed(schedule, request)
        )
        if change is not None:
            progress.replans.append(change.reason)
            self._record(EventKind.REPLANNED, spec, False, note=change.reason)
            for queued in change.queue_now:
                self._queue(queued, "pulled forward by a re-plan")

    def _queue(self, rung: int, note: str) -> None:
        spec = Specialization.decode(rung)
        with self._lock:
            already = spec in self._programs or spec in self._pending
        if already:
            return
        if note:
            self._record(EventKind.EARLY_START, spec, False, note=note)
        self.prefetch(spec)

    def _observed(self, schedule: Schedule, request: Request) -> Observed:
        """Each background build's seconds (load start to loaded), and each rung left
        behind's decode seconds per token (entering it to entering the next, less waits)."""
        began: dict[str, float] = {}
        ready_s: dict[int, float] = {}
        waits: dict[str, float] = {}
        for event in self.events:
            if event.kind is EventKind.LOAD_START and not event.foreground:
                began[event.spec] = event.at_s
            elif event.kind is EventKind.LOADED and event.spec in began:
                rung = _decode_rung(event.spec)
                if rung is not None:
                    ready_s[rung] = event.at_s - began[event.spec]
            elif event.kind is EventKind.WAIT:
                waits[event.spec] = waits.get(event.spec, 0.0) + event.seconds
        decode: dict[int, float] = {}
        entered = self._progress.entered_s
        rungs = [r for r in schedule.rungs if r in entered]
        for low, high in itertools.pairwise(rungs):
            index = schedule.rungs.index(low)
            start = request.prompt_tokens if index == 0 else schedule.rungs[index - 1]
            tokens = low - max(start, request.prompt_tokens)
            spent = entered[high] - entered[low] - waits.get(Specialization.decode(high).label, 0)
            if tokens > 0 and spent > 0:
                decode[low] = spent / tokens
        return Observed(ready_s, decode)


def _decode_rung(label: str) -> int | None:
    phase, _, capacity = label.partition("@")
    return int(capacity) if phase == Phase.DECODE.value and capacity.isdigit() else None
