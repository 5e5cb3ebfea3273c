"""The deadline model: hand-computed plans, the worker queue, the loader's early-start
rule reproduced exactly, laws (hypothesis), and `ovspec plan` on flags and a real store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli
from ovspec.compile.modes import LoadMode
from ovspec.compile.programs import BuildOutcome, Program
from ovspec.errors import BadRequestError
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.loader import EventKind, Loader, Policy
from ovspec.runtime.plan import (
    Plan,
    RungCosts,
    RungValues,
    conclusion,
    plan_one_ahead,
    rung_windows,
    rungs_needed,
    window_plan,
)
from ovspec.runtime.schedule import EarlyStartRule, successors_to_start
from ovspec.store.local import Store

K = 1024
LADDER_8K = Ladder((1 * K, 2 * K, 4 * K, 8 * K))


def costs_8k(c8k: float = 12.0, c4k: float = 8.0) -> RungCosts:
    return RungCosts(
        compile_s={1 * K: 5.0, 2 * K: 6.0, 4 * K: c4k, 8 * K: c8k},
        decode_s_per_token=dict.fromkeys(LADDER_8K, 0.010),
    )


class FakeCompiler:
    """Stands in for ``Compiler`` in a Loader: every load is instant."""

    load_mode = LoadMode.COMPILE  # graphs from the IR: the start keeps the trimmer waiting

    def graph_spec(self, spec: Specialization) -> Specialization:
        return spec  # every specialization has its own graph

    def share_rung(self, capacity_tokens: int) -> None:
        pass  # no graph serves two specializations here

    def load(self, spec: Specialization, halves: bool = False) -> Program:
        build = BuildOutcome(spec, "0" * 32, False, 0.0, 0.0, 0.0, 1, Path("/dev/null"))
        return Program(spec, object(), build, 0.0, None)  # type: ignore[arg-type]


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# -- hand-computed plans ----------------------------------------------------------------


def test_the_seed_shaped_ladder_is_stall_free_and_matches_the_hand_timeline() -> None:
    # 1K/2K/4K/8K, prompt 128, 10 ms/token, compile 5/6/8/12 s.
    # Windows: 1K: (1024-128)*0.01 = 8.96 s; 2K: 1024*0.01 = 10.24 s; 4K: 20.48 s.
    # Foreground: 5 s (decode@1K). 2K compiles 5 -> 11; boundary at 5+8.96 = 13.96: ok +2.96.
    # Enter 2K at 13.96: 4K compiles 13.96 -> 21.96; boundary 24.20: ok +2.24.
    # Enter 4K at 24.20: 8K compiles 24.20 -> 36.20; boundary 44.68: ok +8.48.
    # Last token: 44.68 + 4096*0.01 = 85.64.
    plan = plan_one_ahead(
        LADDER_8K, 128, 8 * K - 128, costs_8k(), early_start=True, rule=EarlyStartRule.WINDOW
    )
    assert plan.foreground_s == 5.0
    expected = [
        # window tokens, window s, compile s, start, ready, boundary, slack
        (896, 8.96, 6.0, 5.0, 11.0, 13.96, 2.96),
        (1024, 10.24, 8.0, 13.96, 21.96, 24.20, 2.24),
        (2048, 20.48, 12.0, 24.20, 36.20, 44.68, 8.48),
    ]
    got = [
        (b.window_tokens, b.window_s, b.compile_s, b.start_s, b.ready_s, b.boundary_s, b.slack_s)
        for b in plan.boundaries
    ]
    assert [g[0] for g in got] == [e[0] for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert all(math.isclose(x, y, abs_tol=1e-9) for x, y in zip(g[1:], e[1:], strict=True))
    assert [b.verdict for b in plan.boundaries] == ["ok", "ok", "ok"]
    assert math.isclose(plan.finished_s, 85.64) and plan.wait_s == 0
    assert conclusion(plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs_8k(), False), plan) == (
        "one-ahead is stall-free on this ladder (smallest slack 2.24 s at 2048→4096)"
    )


def test_a_compile_longer_than_its_window_stalls_and_early_start_removes_it() -> None:
    # 4K now compiles in 12 s > the 2K window (10.24 s).
    # One-ahead: 4K starts on entering 2K (13.96), ready 25.96; boundary 24.20: STALL 1.76 s.
    # Window rule: entering 1K queues 2K (5 -> 11) and 4K (12 > 10.24): 11 -> 23, ready
    # before 24.20: ok +1.20. 8K (12 s) fits the 4K window (20.48): not early.
    one = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs_8k(c4k=12.0), early_start=False)
    assert [b.verdict for b in one.boundaries] == ["ok", "STALL 1.76 s", "ok"]
    assert math.isclose(one.wait_s, 1.76)
    early = plan_one_ahead(
        LADDER_8K,
        128,
        8 * K - 128,
        costs_8k(c4k=12.0),
        early_start=True,
        rule=EarlyStartRule.WINDOW,
    )
    b = early.boundaries[1]
    assert (b.start_s, b.ready_s) == (11.0, 23.0) and math.isclose(b.slack_s, 1.2)
    assert b.verdict == (
        "early start: window of rung 2048 (10.24 s) is shorter than the compile of 4096 (12.00 s)"
    )
    assert not early.stalls and not early.boundaries[2].started_early
    assert conclusion(one, early) == (
        "one-ahead would stall at 2048→4096 by 1.76 s; the loader starts 4096 early, "
        "which removes it"
    )


def test_two_early_compiles_queue_one_behind_the_other() -> None:
    # Compile 5/6/12/22. Entering 1K (t=5) queues 2K, then 4K (12 > 10.24), then 8K
    # (22 > 20.48): one worker, so 2K 5 -> 11, 4K 11 -> 23, 8K 23 -> 45 (not 5 -> 27).
    # 2K->4K: boundary 24.20, ready 23: ok. 4K->8K: boundary 24.20+20.48 = 44.68,
    # ready 45: STALL 0.32 s (one-ahead: entering 4K at 25.96, 8K ready 47.96, boundary
    # 46.44: 1.52 s, after a 1.76 s stall at 2K->4K).
    costs = costs_8k(c4k=12.0, c8k=22.0)
    early = plan_one_ahead(
        LADDER_8K, 128, 8 * K - 128, costs, early_start=True, rule=EarlyStartRule.WINDOW
    )
    slots = {c.capacity_tokens: (c.queued_s, c.start_s, c.ready_s) for c in early.compiles}
    assert slots == {2 * K: (5.0, 5.0, 11.0), 4 * K: (5.0, 11.0, 23.0), 8 * K: (5.0, 23.0, 45.0)}
    assert [c.queued_at_capacity_tokens for c in early.compiles] == [K, K, K]
    assert [round(b.slack_s, 6) for b in early.boundaries] == [2.96, 1.2, -0.32]
    assert early.boundaries[2].verdict.startswith("STALL 0.32 s (started early: window of rung")
    one = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs, early_start=False)
    assert [round(b.wait_s, 6) for b in one.boundaries] == [0.0, 1.76, 1.52]
    line = conclusion(one, early)
    assert line.startswith(
        "one-ahead would stall at 2048→4096 by 1.76 s, 4096→8192 by 1.52 s; the loader "
        "starts 4096, 8192 early and still stalls at 4096→8192 by 0.32 s: prebuild decode@8192"
    )


def test_the_window_rule_still_stalls_where_the_latest_start_rule_does_not() -> None:
    # 8K compiles in 25 s. One-ahead: 8K starts entering 4K (24.20), ready 49.20 vs
    # boundary 44.68: STALL 4.52. Window rule: entering 2K (13.96) queues 8K behind 4K
    # (13.96 -> 21.96), 21.96 -> 46.96: STALL 2.28. Latest start, entering 1K (t=5):
    # deadlines (after t=5) 2K 8.96, 4K 19.20, 8K 39.68; latest starts 8K 14.68, 4K
    # min(19.20, 14.68) - 8 = 6.68 < 8.96 (the next boundary): queue 4K now (11 -> 19).
    # Entering 2K (13.96) queues 8K behind 4K: 19 -> 44 < 44.68: ok +0.68.
    costs = costs_8k(c8k=25.0)
    one = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs, early_start=False)
    window = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs, True, EarlyStartRule.WINDOW)
    latest = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs, True, EarlyStartRule.LATEST_START)
    assert math.isclose(one.wait_s, 4.52) and math.isclose(window.wait_s, 2.28)
    assert latest.wait_s == 0
    four, eight = latest.boundaries[1], latest.boundaries[2]
    assert four.started_early and (four.start_s, four.ready_s) == (11.0, 19.0)
    assert "must start within 6.68 s of entering rung 1024, before the boundary at 8.96 s" in (
        four.early_reason
    )
    # 8K is early too (one-ahead would queue it on entering 4K): entering 2K, its latest
    # start is 30.72 - 25 = 5.72 s later, before the 4K boundary (10.24 s).
    assert eight.started_early and (eight.start_s, eight.ready_s) == (19.0, 44.0)
    assert eight.early_reason.startswith("compile of 8192 must start within 5.72 s of entering")
    assert conclusion(one, window, latest).endswith("(the latest-start rule would remove it)")


def test_a_faster_compile_can_add_a_stall_under_the_window_rule() -> None:
    # Why plan.py offers LATEST_START (and the report proposes it for the loader).
    # Ladder 200..500, prompt 100, 0.125 s/token: every window is 12.5 s.
    # Compile 300: 1 s, 500: 15 s; 400 takes 13.5 s (slow) or 12.5 s (fast).
    # Slow: entering 200 (t=1) queues 300, 400 (13.5 > 12.5) and 500 (15 > 12.5):
    #   300 1->2, 400 2->15.5, 500 15.5->30.5; boundaries 13.5, 26, 38.5: all ok.
    # Fast: 400 no longer qualifies (12.5 <= 12.5), so the chain stops there and 500
    #   waits until 300 is entered: 400 13.5->26, 500 26->41 > 38.5: STALL 2.5 s.
    ladder = Ladder((200, 300, 400, 500))

    def costs(c400: float) -> RungCosts:
        return RungCosts(
            compile_s={200: 1.0, 300: 1.0, 400: c400, 500: 15.0},
            decode_s_per_token=dict.fromkeys(ladder, 0.125),
        )

    slow = plan_one_ahead(ladder, 100, 400, costs(13.5), True, EarlyStartRule.WINDOW)
    fast = plan_one_ahead(ladder, 100, 400, costs(12.5), True, EarlyStartRule.WINDOW)
    assert slow.wait_s == 0
    assert [b.wait_s for b in fast.boundaries] == [0.0, 0.0, 2.5]
    better = plan_one_ahead(ladder, 100, 400, costs(12.5), True, EarlyStartRule.LATEST_START)
    assert better.wait_s == 0


def test_the_prompt_runs_while_the_first_decode_graph_loads() -> None:
    costs = RungCosts(
        compile_s={K: 5.0, 2 * K: 6.0},
        decode_s_per_token={K: 0.01, 2 * K: 0.01},
        prefill_compile_s=2.0,
        prefill_s=0.5,
    )
    plan = plan_one_ahead(Ladder((K, 2 * K)), 128, 2 * K - 128, costs)
    (b,) = plan.boundaries
    # Prefill (2 s) and decode (5 s) graphs are built side by side: the rung is ready
    # at 5 s; the prompt (2 -> 2.5 s) runs meanwhile; the first step at 5 s queues 2K.
    assert plan.foreground_s == 5.0
    assert b.start_s == 5.0 and math.isclose(b.window_s, 8.96)
    assert math.isclose(b.boundary_s, 5.0 + 8.96)
    # A long prompt delays the first step (and the successor) past the decode graph.
    slow = RungCosts(
        compile_s=costs.compile_s,
        decode_s_per_token=costs.decode_s_per_token,
        prefill_compile_s=2.0,
        prefill_s=4.0,
    )
    (late,) = plan_one_ahead(Ladder((K, 2 * K)), 128, 2 * K - 128, slow).boundaries
    assert late.start_s == 6.0 and math.isclose(late.boundary_s, 6.0 + 8.96)


def test_a_request_inside_the_first_rung_has_no_boundary() -> None:
    plan = plan_one_ahead(LADDER_8K, 128, 100, costs_8k())
    assert plan.boundaries == ()
    assert math.isclose(plan.finished_s, 5.0 + 100 * 0.01)
    # The loader still queues the next rung on entering the first: speculative work.
    assert [c.capacity_tokens for c in plan.speculative] == [2 * K]
    assert conclusion(plan, plan) == "the request fits rung 1024: no boundary to cross"


def test_a_short_request_plans_only_the_rungs_it_reaches() -> None:
    assert rungs_needed(LADDER_8K, 128, 2000) == (K, 2 * K, 4 * K)
    assert rungs_needed(LADDER_8K, 1500, 0) == (2 * K,)
    plan = plan_one_ahead(LADDER_8K, 128, 2000, costs_8k())
    assert [b.label for b in plan.boundaries] == ["1024→2048", "2048→4096"]
    # 2128 positions: 80 decode steps on 4K after its boundary.
    assert math.isclose(plan.finished_s, plan.boundaries[-1].boundary_s + 80 * 0.01)


@pytest.mark.parametrize(
    ("prompt", "new", "match"),
    [
        # Library errors name the Python argument (the CLI prints --prompt-tokens).
        (0, 10, "prompt_tokens=0 must be at least 1"),
        (128, -1, "must not be negative"),
        (128, 8 * K, "over the top rung 8192; extend ladder= or lower new_tokens="),
    ],
)
def test_requests_that_do_not_fit_are_refused(prompt: int, new: int, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        rungs_needed(LADDER_8K, prompt, new)


def test_missing_costs_name_the_rungs() -> None:
    costs = RungCosts(compile_s={K: 1.0}, decode_s_per_token=dict.fromkeys(LADDER_8K, 0.01))
    with pytest.raises(BadRequestError, match="no compile time for rung 2048, 4096, 8192"):
        plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs)


def test_costs_are_validated() -> None:
    with pytest.raises(BadRequestError, match="compile time of rung 1024"):
        RungCosts(compile_s={K: -1.0}, decode_s_per_token={})
    with pytest.raises(BadRequestError, match="prefill time"):
        RungCosts(compile_s={}, decode_s_per_token={}, prefill_s=math.nan)


# -- flags ------------------------------------------------------------------------------


def test_rung_values_parse_per_rung_single_and_mixed() -> None:
    assert RungValues.parse("1024=0.8,2K=1.0", "--compile-s").resolve(
        [K, 2 * K], Ladder((K, 2 * K)), "--compile-s"
    ) == {K: 0.8, 2 * K: 1.0}
    assert RungValues.parse("3.1", "--decode-ms").resolve(
        [K], Ladder((K, 2 * K)), "--decode-ms"
    ) == {K: 3.1, 2 * K: 3.1}
    assert RungValues.parse("1,2048=2", "--x").resolve([K], Ladder((K, 2 * K)), "--x") == {
        K: 1.0,
        2 * K: 2.0,
    }


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "malformed"),
        ("1024=", "is not a number"),
        ("1024=x", "is not a number"),
        ("abc=1", "does not name a rung"),
        ("1024=-1", "finite number >= 0"),
        ("1024=inf", "finite number >= 0"),
        ("1,2", "two values for every rung"),
        ("1024=1,1024=2", "names rung 1024 twice"),
        ("1024=1,,2048=1", "malformed"),
    ],
)
def test_rung_values_reject_bad_text(text: str, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        RungValues.parse(text, "--compile-s")


def test_rung_values_must_cover_the_rungs_and_stay_on_the_ladder() -> None:
    ladder = Ladder((K, 2 * K))
    with pytest.raises(BadRequestError, match="names rung 3000, not on the ladder"):
        RungValues.parse("3000=1", "--compile-s").resolve([K], ladder, "--compile-s")
    with pytest.raises(BadRequestError, match="no value for rung 2048"):
        RungValues.parse("1024=1", "--compile-s").resolve([K, 2 * K], ladder, "--compile-s")


# -- the loader reads the same plan ---------------------------------------------------------


def loader_early_starts(plan: Plan, ladder: Ladder) -> list[tuple[str, str]]:
    """Drive a real Loader (instant fake compiles) through the plan's rungs, in order,
    and return its EARLY_START events."""
    fake = FakeCompiler()
    with Loader(
        fake, ladder, Policy.ONE_AHEAD, window_plan=window_plan(plan), warm_up=False
    ) as loader:  # type: ignore[arg-type]
        rungs = rungs_needed(ladder, plan.prompt_tokens, plan.new_tokens)
        loader.start(rungs[0])
        for rung in rungs:  # the first rung's first decode step queues its successors
            loader.get(rung)
        return [(e.spec, e.note) for e in loader.events if e.kind is EventKind.EARLY_START]


def plan_early_starts(plan: Plan) -> list[tuple[str, str]]:
    return [
        (f"decode@{c.capacity_tokens}", c.early_reason) for c in plan.compiles if c.started_early
    ]


@pytest.mark.parametrize(("c4k", "c8k"), [(8.0, 12.0), (12.0, 12.0), (12.0, 22.0), (8.0, 25.0)])
def test_the_loader_starts_early_exactly_what_the_plan_reports(c4k: float, c8k: float) -> None:
    plan = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs_8k(c4k=c4k, c8k=c8k))
    assert loader_early_starts(plan, LADDER_8K) == plan_early_starts(plan)


def test_window_plan_from_costs_equals_the_plans() -> None:
    plan = plan_one_ahead(LADDER_8K, 128, 8 * K - 128, costs_8k())
    assert window_plan(plan) == window_plan(costs_8k(), LADDER_8K, 128)
    assert window_plan(plan).window_s == {K: 896 * 0.01, 2 * K: 1024 * 0.01, 4 * K: 2048 * 0.01}
    with pytest.raises(BadRequestError, match="needs the ladder"):
        window_plan(costs_8k())


# -- laws -------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Ladder, int, int, RungCosts]:
    steps = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    caps = tuple(64 * sum(steps[: i + 1]) for i in range(len(steps)))
    ladder = Ladder(caps)
    prompt = draw(st.integers(1, caps[0]))
    new = draw(st.integers(0, caps[-1] - prompt))
    seconds = st.floats(0.0, 30.0, allow_nan=False, allow_infinity=False)
    rates = st.floats(1e-4, 0.05, allow_nan=False, allow_infinity=False)
    costs = RungCosts(
        compile_s={c: draw(seconds) for c in caps},
        decode_s_per_token={c: draw(rates) for c in caps},
        prefill_compile_s=draw(st.floats(0.0, 3.0)),
        prefill_s=draw(st.floats(0.0, 3.0)),
    )
    return ladder, prompt, new, costs


RULES = [None, EarlyStartRule.WINDOW, EarlyStartRule.LATEST_START]


def make_plan(scenario: tuple[Ladder, int, int, RungCosts], rule: EarlyStartRule | None) -> Plan:
    ladder, prompt, new, costs = scenario
    if rule is None:
        return plan_one_ahead(ladder, prompt, new, costs, early_start=False)
    return plan_one_ahead(ladder, prompt, new, costs, True, rule)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(RULES))
def test_slack_is_window_minus_compile_when_the_worker_starts_on_entry(
    scenario: tuple[Ladder, int, int, RungCosts], rule: EarlyStartRule | None
) -> None:
    plan = make_plan(scenario, rule)
    for b in plan.boundaries:
        entered_s = b.boundary_s - b.window_s
        if rule is None:
            assert math.isclose(b.start_s, entered_s, abs_tol=1e-9)
        if math.isclose(b.start_s, entered_s, abs_tol=1e-9):
            assert math.isclose(b.slack_s, b.window_s - b.compile_s, abs_tol=1e-6)
        assert b.ready_s >= b.start_s and b.stalls == (b.slack_s < 0)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(RULES[1:]))
def test_early_start_never_lowers_a_boundarys_slack(
    scenario: tuple[Ladder, int, int, RungCosts], rule: EarlyStartRule
) -> None:
    # Each rung is queued on entering its predecessor at the latest, and by then every
    # rung before it is ready (FIFO), so its slack is at least one-ahead's.
    one = make_plan(scenario, None)
    early = make_plan(scenario, rule)
    for a, b in zip(one.boundaries, early.boundaries, strict=True):
        assert b.slack_s >= a.slack_s - 1e-9
    assert early.wait_s <= one.wait_s + 1e-9


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.data())
def test_a_faster_compile_never_adds_a_stall(
    scenario: tuple[Ladder, int, int, RungCosts], data: st.DataObject
) -> None:
    ladder, prompt, new, costs = scenario
    rung = data.draw(st.sampled_from(list(ladder)))
    factor = data.draw(st.floats(0.0, 1.0))
    faster = RungCosts(
        compile_s={**costs.compile_s, rung: costs.compile_s[rung] * factor},
        decode_s_per_token=costs.decode_s_per_token,
        prefill_compile_s=costs.prefill_compile_s,
        prefill_s=costs.prefill_s,
    )
    for rule in (None, EarlyStartRule.LATEST_START):
        before = make_plan((ladder, prompt, new, costs), rule)
        after = make_plan((ladder, prompt, new, faster), rule)
        for a, b in zip(before.boundaries, after.boundaries, strict=True):
            assert not (b.stalls and not a.stalls), (rule, a, b)
        assert after.wait_s <= before.wait_s + 1e-9
    # Not so for the loader's window rule: see the hand-made counterexample above.


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_latest_start_rule_never_waits_longer_than_the_window_rule(
    scenario: tuple[Ladder, int, int, RungCosts],
) -> None:
    window = make_plan(scenario, EarlyStartRule.WINDOW)
    latest = make_plan(scenario, EarlyStartRule.LATEST_START)
    assert latest.wait_s <= window.wait_s + 1e-9


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_the_loader_and_the_plan_pick_the_same_successors(
    scenario: tuple[Ladder, int, int, RungCosts],
) -> None:
    ladder, prompt, _new, costs = scenario
    plan = window_plan(costs, ladder, prompt)
    with Loader(
        FakeCompiler(), ladder, Policy.ONE_AHEAD, window_plan=plan, warm_up=False
    ) as loader:  # type: ignore[arg-type]
        for rung in (r for r in ladder if r >= ladder.rung_for(prompt)):
            theirs = [(s.capacity_tokens, note) for s, note in loader._successors_to_queue(rung)]
            ours = successors_to_start(ladder, rung, plan.compile_s, plan.window_s, plan.rule)
            assert theirs == ours


def test_windows_leave_out_rungs_below_the_prompt_and_the_top() -> None:
    costs = costs_8k()
    # Prompt 1500 starts on 2K (548 steps there); 4K gets 2048 steps; 8K is the top.
    assert rung_windows(LADDER_8K, 1500, costs) == {2 * K: 548 * 0.01, 4 * K: 2048 * 0.01}


def test_the_module_does_not_load_openvino() -> None:
    code = (
        "import sys, ovspec.runtime.plan, ovspec.runtime.schedule;"
        "sys.exit(any(m.startswith('openvino') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- the command ------------------------------------------------------------------------


def test_help_lists_the_options() -> None:
    result = run("plan", "--help")
    assert result.exit_code == 0
    for option in (
        "--ladder",
        "--prompt-tokens",
        "--new-tokens",
        "--device",
        "--config",
        "--compress",
        "--blob-mode",
        "--chunk",
        "--compile-s",
        "--decode-ms",
        "--measure",
        "--measure-steps",
        "--no-early-start",
        "--rule",
        "--cache-dir",
        "--json",
    ):
        assert option in result.output


FLAGS = ["--ladder", "1K,2K,4K,8K", "--prompt-tokens", "128", "--decode-ms", "10"]


def test_flags_only_text_table_and_conclusion(tmp_path: Path) -> None:
    result = run(
        "plan",
        "unused",
        *FLAGS,
        "--compile-s",
        "1024=5,2048=6,4096=12,8192=12",
        "--rule",
        "window",
        "--cache-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("2048→4096"))
    assert row.split()[:4] == ["2048→4096", "1024", "10.240", "12.000"]
    assert "early start: window of rung 2048 (10.24 s)" in row
    assert (
        "one-ahead would stall at 2048→4096 by 1.76 s; the loader starts 4096 early, "
        "which removes it"
    ) in lines
    assert lines[-1].startswith("predicted last token: auto ")  # auto's schedule follows
    assert list(tmp_path.iterdir()) == []  # flags alone never open the store


def test_flags_only_json_has_every_number() -> None:
    compile_s = ["--compile-s", "1024=5,2048=6,4096=8,8192=25"]
    result = run("plan", "unused", *FLAGS, *compile_s, "--rule", "window", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["new_tokens"] == 8 * K - 128
    assert [b["verdict"][:5] for b in doc["plan"]["boundaries"]] == ["ok", "ok", "STALL"]
    assert math.isclose(doc["plan"]["wait_s"], 2.28) and math.isclose(
        doc["one_ahead"]["wait_s"], 4.52
    )
    assert doc["rungs"][0] == {
        "capacity_tokens": 1024,
        "compile_s": 5.0,
        "fetch_s": None,  # no remote tier holds it
        "decode_s_per_token": 0.01,
        "window_s": 8.96,
    }
    assert doc["conclusion"].endswith("(the latest-start rule would remove it)")
    # The default rule (the loader's) is latest-start, and it does remove it.
    default = json.loads(run("plan", "unused", *FLAGS, *compile_s, "--json").stdout)
    assert default["plan"]["wait_s"] == 0


def test_no_early_start_plans_pure_one_ahead() -> None:
    result = run(
        "plan",
        "unused",
        *FLAGS,
        "--compile-s",
        "1024=5,2048=6,4096=12,8192=12",
        "--no-early-start",
        "--json",
    )
    doc = json.loads(result.stdout)
    assert doc["plan"]["early_start"] is False and math.isclose(doc["plan"]["wait_s"], 1.76)
    assert "(early start off)" in doc["conclusion"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--compile-s", "1024=x"], "is not a number"),
        (["--compile-s", "3000=1"], "names rung 3000, not on the ladder"),
        (["--compile-s", "1024=1"], "--compile-s has no value for rung 2048"),
        (["--compile-s", "1", "--measure"], "--decode-ms and --measure both"),
        (["--compile-s", "1", "--new-tokens", "9000"], "over the top rung 8192"),
        (["--compile-s", "1", "--rule", "asap"], "'asap' is not one of"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], match: str) -> None:
    result = run("plan", "unused", *FLAGS, *args)
    assert result.exit_code == 2, result.output
    assert match in result.output


# -- the store's history and a measurement (a real tiny model) ------------------------------


@pytest.fixture(scope="module")
def built_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan-store")
    result = run("build", "builtin:tiny", "--ladder", "32,64,128", "--cache-dir", str(root))
    assert result.exit_code == 0, result.output
    return root


def test_history_gives_the_recorded_compile_of_each_rung(built_store: Path) -> None:
    result = run(
        "plan",
        "builtin:tiny",
        "--ladder",
        "32,64,128",
        "--prompt-tokens",
        "16",
        "--decode-ms",
        "1",
        "--cache-dir",
        str(built_store),
        "--json",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    with Store(built_store) as store:
        recorded = {
            e.metadata["specialization"]: e.compile_s + float(e.metadata["export_s"])
            for e in store.entries()
        }
        assert store.check() == []
    by_rung = {r["capacity_tokens"]: r for r in doc["rungs"]}
    for rung in (32, 64, 128):
        assert math.isclose(by_rung[rung]["compile_s"], recorded[f"decode@{rung}"])
        assert by_rung[rung]["history"]["key"] in {e for e in _hexes(built_store)}
    assert math.isclose(doc["prefill_compile_s"], recorded["prefill@32x32"])
    assert doc["sources"]["compile"].startswith("store history")


def _hexes(root: Path) -> set[str]:
    with Store(root) as store:
        return {e.hex for e in store.entries()}


def test_missing_history_exits_2_naming_the_rungs(built_store: Path) -> None:
    result = run(
        "plan",
        "builtin:tiny",
        "--ladder",
        "32,64,256",
        "--prompt-tokens",
        "16",
        "--decode-ms",
        "1",
        "--cache-dir",
        str(built_store),
    )
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "no compile history for decode@256 in the store" in line
    assert "ovspec build" in line and "--compile-s" in line


def test_history_is_exact_other_properties_find_nothing(built_store: Path) -> None:
    result = run(
        "plan",
        "builtin:tiny",
        "--ladder",
        "32,64,128",
        "--prompt-tokens",
        "16",
        "--decode-ms",
        "1",
        "--config",
        "INFERENCE_PRECISION_HINT=f32",
        "--cache-dir",
        str(built_store),
    )
    assert result.exit_code == 2
    assert "no compile history for decode@32, decode@64, decode@128" in result.output


def test_with_no_decode_rate_the_plan_measures_it(built_store: Path) -> None:
    args = ["plan", "builtin:tiny", "--ladder", "32,64,128", "--prompt-tokens", "16"]
    result = run(*args, "--measure-steps", "2", "--cache-dir", str(built_store), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["sources"]["decode"].startswith("measured")
    assert all(r["measured"]["steps"] == 2 for r in doc["rungs"])


def test_measure_times_a_decode_on_each_rung(built_store: Path) -> None:
    result = run(
        "plan",
        "builtin:tiny",
        "--ladder",
        "32,64,128",
        "--prompt-tokens",
        "16",
        "--measure",
        "--measure-steps",
        "4",
        "--cache-dir",
        str(built_store),
        "--json",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for rung in doc["rungs"]:
        measured = rung["measured"]
        # On CPU the loader compiles each rung from the IR (DESIGN.md §10.15): the plan
        # measures what a run does, so no rung comes from the store.
        assert measured["store_hit"] is False and measured["steps"] == 4
        assert rung["decode_s_per_token"] == measured["decode_s_per_token"] > 0
        assert math.isclose(
            rung["compile_s"], measured["compile_s"] + measured["export_s"] + measured["import_s"]
        )
    assert doc["prefill_s"] > 0 and doc["sources"]["decode"].startswith("measured")
    assert "decoding 4 steps on decode@128" in result.stderr
    assert len(doc["plan"]["boundaries"]) == 2


def test_a_start_that_is_already_late_says_so() -> None:
    ladder = Ladder((1 * K, 2 * K, 4 * K))
    picked = successors_to_start(
        ladder,
        1 * K,
        compile_s={2 * K: 0.5, 4 * K: 5.0},
        window_s={1 * K: 1.0, 2 * K: 2.0},
        rule=EarlyStartRule.LATEST_START,
    )
    assert [rung for rung, _ in picked] == [2 * K, 4 * K]
    assert picked[1][1] == (
        "compile of 4096 is already 2.00 s late on entering rung 1024, before the boundary "
        "at 1.00 s"
    )
