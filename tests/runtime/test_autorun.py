"""The auto loader runs its decision: the rungs it keeps, builds queued ahead as the
schedule says, one ahead without costs, a re-plan on drifted builds, and the queued
builds an early end cancels (a fake compiler, a scripted clock)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_loader import FakeCompiler
from waiting import wait_until

from ovspec.compile.programs import Program
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import AutoCosts, Lanes
from ovspec.runtime.autorun import AutoLoader
from ovspec.runtime.loader import EventKind
from ovspec.store import Store

TWO_AHEAD = Ladder((32, 40, 128))
# 40's window (8 tokens, 2.9 s) hides no 5 s build of 128: it must start on entering 32.
TWO_AHEAD_COSTS = AutoCosts(
    {32: 1.0, 40: 4.0, 128: 5.0},
    {32: 0.36, 40: 0.36, 128: 0.72},
    {32: 1.0},
    {32: 0.1},
)


def auto_loader(
    fake: FakeCompiler, ladder: Ladder, costs: AutoCosts | None, clock: object = None
) -> AutoLoader:
    extra = {"clock": clock} if clock is not None else {}
    return AutoLoader(
        fake,  # type: ignore[arg-type]
        ladder,
        costs,
        Lanes(1, 1),
        prefill_chunk_tokens=4,
        warm_up=False,
        **extra,
    )


def loaded(loader: AutoLoader, rung: int) -> bool:
    return loader.ready(Specialization.decode(rung))


def test_runs_the_chosen_schedule_two_ahead() -> None:
    fake = FakeCompiler()
    with auto_loader(fake, TWO_AHEAD, TWO_AHEAD_COSTS) as loader:
        ladder = loader.begin_request(4, 124, may_stop_early=False)
        assert loader.schedule is not None and loader.schedule.name == "two ahead"
        assert ladder == TWO_AHEAD
        planned = [e for e in loader.events if e.kind is EventKind.PLANNED]
        assert len(planned) == 1 and "two ahead" in planned[0].note
        assert planned[0].seconds == pytest.approx(loader.decision.chosen.finished_s)  # type: ignore[union-attr]
        loader.start(32)
        loader.get(32)  # entering 32 queues 40 and 128
        wait_until(lambda: loaded(loader, 40) and loaded(loader, 128), "40 and 128")
        early = [e.spec for e in loader.events if e.kind is EventKind.EARLY_START]
        assert early == ["decode@128"]


def test_skipped_rungs_are_not_in_the_request_ladder() -> None:
    costs = AutoCosts(
        {32: 1.0, 64: 8.0, 128: 1.0, 256: 1.0},
        {32: 0.03, 64: 0.03, 128: 0.045, 256: 0.3},
        {32: 1.0},
        {32: 0.1},
    )
    with auto_loader(FakeCompiler(), Ladder((32, 64, 128, 256)), costs) as loader:
        ladder = loader.begin_request(4, 252, may_stop_early=False)
        assert 64 not in ladder and ladder.top_tokens == 256


class EmptyStore(FakeCompiler):
    """A compiler whose store has no history yet."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.store = Store(root)

    def key(self, spec: Specialization) -> SimpleNamespace:
        return SimpleNamespace(hex=spec.label.replace("@", "-"), components=())


def test_without_costs_it_runs_one_ahead_and_says_why(tmp_path: Path) -> None:
    fake = EmptyStore(tmp_path / "store")
    with auto_loader(fake, TWO_AHEAD, None) as loader:
        loader.begin_request(4, 124, may_stop_early=False)
        note = next(e.note for e in loader.events if e.kind is EventKind.PLANNED)
        assert note.startswith("one ahead: no compile history for decode@32")
        loader.start(32)
        loader.get(32)
        wait_until(lambda: loaded(loader, 40), "40")
        assert not loaded(loader, 128) and "decode@128" not in fake.loaded


def test_an_early_end_cancels_the_builds_not_started() -> None:
    gate = threading.Event()
    fake = FakeCompiler(gates={40: gate})
    with auto_loader(fake, TWO_AHEAD, TWO_AHEAD_COSTS) as loader:
        loader.begin_request(4, 124, may_stop_early=False)
        loader.start(32)
        loader.get(32)  # 40 builds (held at its gate), 128 waits in the queue
        wait_until(
            lambda: any(
                e.spec == "decode@40" and e.kind is EventKind.LOAD_START for e in loader.events
            ),
            "40 to start",
        )
        loader.end_request(32)
        gate.set()
        cancelled = [e.spec for e in loader.events if e.note == "cancelled: the request ended"]
        assert cancelled == ["decode@128"]
        wait_until(lambda: loaded(loader, 40), "40")
    assert "decode@128" not in fake.loaded


class Clock:
    """Seconds that move only when told (a build's duration is scripted)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class SlowBuilds(FakeCompiler):
    def __init__(self, clock: Clock, seconds: dict[int, float]) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def load(self, spec: Specialization, halves: bool = False) -> Program:
        self.clock.now_s += self.seconds.get(spec.capacity_tokens, 0.0)
        return super().load(spec, halves)


def test_replans_when_a_build_drifts() -> None:
    # One ahead hides 0.6 s builds, guarded too (72's window: 8 tokens, 1.1 s, against
    # 0.75 s); 64 takes 3 s instead.
    ladder = Ladder((32, 64, 72, 128))
    costs = AutoCosts(
        dict.fromkeys(ladder, 0.6), dict.fromkeys(ladder, 0.1375), {32: 1.0}, {32: 0.1}
    )
    clock = Clock()
    fake = SlowBuilds(clock, {64: 3.0})
    with auto_loader(fake, ladder, costs, clock) as loader:
        loader.begin_request(4, 124, may_stop_early=False)
        assert loader.schedule is not None and loader.schedule.name == "one ahead"
        loader.start(32)
        loader.get(32)
        wait_until(lambda: loaded(loader, 64), "64")
        loader.get(64)  # entering 64: 64's build ran 3x the plan's
        wait_until(lambda: loaded(loader, 128), "128 pulled forward")
        replanned = [e for e in loader.events if e.kind is EventKind.REPLANNED]
        assert len(replanned) == 1 and "queue 128 now" in replanned[0].note


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("ovspec-loader")],
        "loader threads to stop",
    )
