"""The lazy loader: policies, background prefetch, waits, failures, threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from waiting import wait_until

from ovspec.compile.modes import LoadMode
from ovspec.compile.programs import BuildOutcome, Program
from ovspec.errors import CompileError
from ovspec.ir.specialize import Phase, Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.loader import (
    EventKind,
    Loader,
    Policy,
    WindowPlan,
    builds_left_running,
)
from ovspec.runtime.schedule import reachable_top_tokens

LADDER = Ladder((32, 64, 128, 256))


class FakeCompiler:
    """Stands in for ``Compiler``: sleeps ``load_s`` per load, can fail on chosen rungs,
    and holds a rung's load until its ``gates`` event is set."""

    load_mode = LoadMode.COMPILE  # graphs from the IR: the start keeps the trimmer waiting

    def __init__(
        self,
        load_s: float = 0.0,
        fail: frozenset[int] = frozenset(),
        gates: dict[int, threading.Event] | None = None,
    ) -> None:
        self.load_s = load_s
        self.fail = fail
        self.gates = gates or {}
        self.loaded: list[str] = []
        self.halved: list[str] = []  # loads asked to compile in two halves
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def graph_spec(self, spec: Specialization) -> Specialization:
        return spec  # every specialization has its own graph

    def share_rung(self, capacity_tokens: int) -> None:
        pass  # no graph serves two specializations here

    def build_ahead(self, spec: Specialization) -> None:
        pass  # no build delegate here

    def load(self, spec: Specialization, halves: bool = False) -> Program:
        time.sleep(self.load_s)
        gate = self.gates.get(spec.capacity_tokens)
        if gate is not None:
            assert gate.wait(30.0), f"{spec.label}: its gate never opened"
        with self.lock:
            self.loaded.append(spec.label)
            if halves:
                self.halved.append(spec.label)
            self.threads.add(threading.current_thread().name)
        if spec.capacity_tokens in self.fail:
            raise CompileError(f"CPU failed to compile {spec.label}: injected")
        build = BuildOutcome(spec, "0" * 32, False, self.load_s, 0.0, 0.0, 1, Path("/dev/null"))
        return Program(spec, object(), build, 0.0, None)  # type: ignore[arg-type]


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ovspec-loader")]


def wait_idle(loader: Loader, spec: Specialization) -> None:
    wait_until(lambda: loader.ready(spec), f"{spec.label} to be ready")


def test_one_ahead_loads_the_first_rung_in_front_and_one_successor_behind() -> None:
    fake = FakeCompiler()
    with Loader(fake, LADDER, Policy.ONE_AHEAD, prefill_chunk_tokens=16, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        # start() returns once the prompt's graph is in; the first rung's decode graph
        # loads on the worker meanwhile, and nothing else is queued yet.
        assert loader.ready(Specialization.prefill(32, 16))
        wait_idle(loader, Specialization.decode(32))
        time.sleep(0.05)
        assert sorted(fake.loaded) == ["decode@32", "prefill@32x16"]
        starts = [(e.spec, e.foreground) for e in loader.events if e.kind is EventKind.LOAD_START]
        assert sorted(starts) == [("decode@32", True), ("prefill@32x16", True)]
        loader.get(32)  # the first decode step queues the successor, and only it
        wait_idle(loader, Specialization.decode(64))
        assert fake.loaded[2:] == ["decode@64"]
        starts = [(e.spec, e.foreground) for e in loader.events if e.kind is EventKind.LOAD_START]
        assert starts[2:] == [("decode@64", False)]
        assert not any(e.kind is EventKind.WAIT for e in loader.events)
        loader.get(64)  # crossing into 64 queues 128, and only 128
        wait_idle(loader, Specialization.decode(128))
        time.sleep(0.05)
        assert fake.loaded[-1] == "decode@128" and "decode@256" not in fake.loaded
        assert not any(e.kind is EventKind.WAIT for e in loader.events)
        assert any(name.startswith("ovspec-loader") for name in fake.threads)


@pytest.mark.parametrize("warm_first_rung", [True, False])
def test_a_request_s_first_rung_is_warmed_only_where_asked(
    monkeypatch: pytest.MonkeyPatch, warm_first_rung: bool
) -> None:
    """The first rung loads beside the prompt's run: a profile may leave its warm-up to
    its first decode step. A successor is warmed either way (its first step is a
    boundary's)."""
    monkeypatch.setattr("ovspec.runtime.loader.warm_up", lambda compiled: 0.25)
    fake = FakeCompiler()
    with Loader(
        fake,  # type: ignore[arg-type]
        LADDER,
        Policy.ONE_AHEAD,
        prefill_chunk_tokens=16,
        warm_first_rung=warm_first_rung,
    ) as loader:
        loader.start(32)
        loader.get(32)
        wait_idle(loader, Specialization.decode(64))
        loaded = {e.spec: e.note for e in loader.events if e.kind is EventKind.LOADED}
    first = "warm-up 0.250 s" if warm_first_rung else "warm-up 0.000 s"
    assert loaded["decode@32"].endswith(first)
    assert loaded["decode@64"].endswith("warm-up 0.250 s")
    assert loaded["prefill@32x16"].endswith("warm-up 0.000 s")  # a prompt graph never is


def test_eager_loads_every_rung_before_the_first_token() -> None:
    fake = FakeCompiler()
    with Loader(fake, LADDER, Policy.EAGER, prefill_chunk_tokens=16, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        assert sorted(fake.loaded) == sorted(
            ["prefill@32x16", "decode@32", "decode@64", "decode@128", "decode@256"]
        )
        assert all(e.foreground for e in loader.events)
        assert any(name.startswith("ovspec-loader") for name in fake.threads)


def test_on_demand_never_prefetches() -> None:
    fake = FakeCompiler()
    with Loader(fake, LADDER, Policy.ON_DEMAND, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        loader.get(64)
        time.sleep(0.05)
        assert fake.loaded == ["decode@32", "decode@64"]
        assert all(e.foreground for e in loader.events)


def test_a_successor_not_ready_in_time_is_waited_for_and_the_wait_recorded() -> None:
    gate = threading.Event()
    fake = FakeCompiler(gates={64: gate})
    with Loader(fake, LADDER, Policy.ONE_AHEAD, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        loader.get(32)  # the first step: decode@64 starts behind, held at its gate
        opener = threading.Timer(0.5, gate.set)  # the main thread waits at get(64) by then
        opener.start()
        loader.get(64)  # the boundary comes before the compile is done
        opener.join()
        waits = [e for e in loader.events if e.kind is EventKind.WAIT]
        assert [w.spec for w in waits] == ["decode@64"]
        assert 0.1 < waits[0].seconds < 30.0


def test_a_failed_successor_surfaces_at_its_boundary() -> None:
    fake = FakeCompiler(fail=frozenset({64}))
    with Loader(fake, LADDER, Policy.ONE_AHEAD, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        loader.get(32)  # the rung-32 graph is fine; 64 fails in the background
        wait_until(lambda: any(e.kind is EventKind.FAILED for e in loader.events), "the failure")
        with pytest.raises(CompileError, match="decode@64: injected"):
            loader.get(64)
        assert fake.loaded.count("decode@64") == 1  # not compiled a second time


def test_plan_starts_a_successor_early_when_its_window_is_too_short() -> None:
    fake = FakeCompiler()
    # Rung 64's window (0.1 s) cannot hide the compile of 128 (0.5 s): queue it at 32.
    plan = WindowPlan(
        compile_s={64: 0.05, 128: 0.5, 256: 0.05}, window_s={32: 1.0, 64: 0.1, 128: 1.0}
    )
    with Loader(fake, LADDER, Policy.ONE_AHEAD, window_plan=plan, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32)
        loader.get(32)
        wait_idle(loader, Specialization.decode(128))
        early = [e for e in loader.events if e.kind is EventKind.EARLY_START]
        assert [e.spec for e in early] == ["decode@128"]
        assert "compile of 128 must start" in early[0].note
        assert "decode@256" not in fake.loaded


def test_close_leaves_no_threads_and_refuses_more_work() -> None:
    fake = FakeCompiler(load_s=0.05)
    loader = Loader(fake, LADDER, Policy.ONE_AHEAD, warm_up=False)  # type: ignore[arg-type]
    loader.start(32)
    loader.close()
    loader.close()  # idempotent
    assert loader_threads() == []
    with pytest.raises(Exception, match="closed"):
        loader.get(32)


def test_concurrent_gets_share_one_load() -> None:
    fake = FakeCompiler(load_s=0.05)
    with Loader(fake, LADDER, Policy.ON_DEMAND, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.prefetch(64)
        threads = [threading.Thread(target=loader.get, args=(64,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert fake.loaded == ["decode@64"]


def test_concurrent_foreground_gets_share_one_load() -> None:
    fake = FakeCompiler(load_s=0.05)
    with Loader(fake, LADDER, Policy.ON_DEMAND, warm_up=False) as loader:  # type: ignore[arg-type]
        threads = [threading.Thread(target=loader.get, args=(128,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert fake.loaded == ["decode@128"]


class SharingFakeCompiler(FakeCompiler):
    """As COMPILE mode on CPU: the prompt's rung decodes on its prefill graph."""

    def graph_spec(self, spec: Specialization) -> Specialization:
        if spec.phase is Phase.DECODE and spec.capacity_tokens == 32:
            return Specialization.prefill(32, 16)
        return spec


@pytest.mark.parametrize("sharing", [True, False])
@pytest.mark.parametrize("policy", [Policy.ONE_AHEAD, Policy.ON_DEMAND])
def test_only_the_graph_the_prompt_waits_for_is_halved(policy: Policy, sharing: bool) -> None:
    """Halving pays off only while nothing else loads: the prompt's graph at a lazy
    start when it also decodes the rung. Beside the first decode graph's load on the
    worker, or for successors loading beside a decode, graphs compile whole."""
    fake = SharingFakeCompiler() if sharing else FakeCompiler()
    with Loader(
        fake,  # type: ignore[arg-type]
        LADDER,
        policy,
        prefill_chunk_tokens=16,
        warm_up=False,
        halve_prompt_graph=True,
    ) as loader:
        loader.start(32)
        loader.get(32)
        loader.get(64)
    assert fake.halved == (["prefill@32x16"] if sharing else [])
    assert {"decode@32", "decode@64"} <= set(fake.loaded)


# -- the request's reachable length -----------------------------------------------------


def test_one_ahead_never_starts_a_rung_the_request_cannot_reach() -> None:
    fake = FakeCompiler()
    with Loader(fake, LADDER, Policy.ONE_AHEAD, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32, reachable_tokens=60)  # 60 KV positions: rung 64 at most
        assert loader.reachable_top_tokens == 64
        loader.get(32)  # queues 64: the request reaches it
        wait_idle(loader, Specialization.decode(64))
        loader.get(64)  # would queue 128 without the cap
        time.sleep(0.05)
        assert sorted(fake.loaded) == ["decode@32", "decode@64"]
        assert loader.builds_in_flight() == ()
        # A new request that reaches further lifts the cap.
        loader.start(32, reachable_tokens=200)
        loader.get(64)
        wait_idle(loader, Specialization.decode(128))
        assert "decode@256" not in fake.loaded


def test_eager_builds_only_the_rungs_the_request_can_reach() -> None:
    fake = FakeCompiler()
    with Loader(fake, LADDER, Policy.EAGER, prefill_chunk_tokens=16, warm_up=False) as loader:  # type: ignore[arg-type]
        loader.start(32, reachable_tokens=64)  # exactly rung 64's capacity
        assert sorted(fake.loaded) == sorted(["prefill@32x16", "decode@32", "decode@64"])


@pytest.mark.parametrize(
    ("reachable", "top"), [(None, 256), (1, 32), (33, 64), (256, 256), (10_000, 256)]
)
def test_the_reachable_top_is_the_rung_that_holds_the_request(
    reachable: int | None, top: int
) -> None:
    assert reachable_top_tokens(LADDER, reachable) == top


def test_close_without_waiting_leaves_the_build_to_finish_on_the_worker() -> None:
    gate = threading.Event()
    closed = threading.Event()
    fake = FakeCompiler(gates={64: gate})
    loader = Loader(fake, LADDER, Policy.ONE_AHEAD, warm_up=False, on_close=(closed.set,))  # type: ignore[arg-type]
    loader.start(32)
    loader.get(32)  # decode@64 starts behind, held at its gate
    wait_until(lambda: loader.builds_in_flight() == ("decode@64",), "decode@64 under way")
    loader.close(wait_for_builds=False)  # returns with the build still running
    assert not closed.is_set() and builds_left_running()
    gate.set()
    wait_until(closed.is_set, "the owned resources closed after the build")
    wait_until(lambda: not builds_left_running(), "the worker to end")
    with pytest.raises(Exception, match="closed"):
        loader.get(64)
