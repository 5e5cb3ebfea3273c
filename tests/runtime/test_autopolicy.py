"""The auto policy on scripted costs: each decision (skip a rung, start bigger, two
ahead, up front, more lanes, re-plan on drift, a request that may end early) in a case
built so that only that decision is fastest, and the law that auto's prediction is
never slower than the fixed policies' beside it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import (
    TIE_RELATIVE,
    TIE_S,
    AutoCosts,
    Lanes,
    Request,
    Start,
    Trigger,
    ahead,
    choose,
    simulate,
)
from ovspec.runtime.replanning import Observed, abandoned, replan

K = 1024
SERIAL = Lanes(1, 1)  # the split: the host builds one blob at a time


def costs(
    ready: dict[int, float],
    decode: dict[int, float],
    prefill_ready: float = 1.0,
    prefill: float = 0.1,
    first: int = K,
) -> AutoCosts:
    return AutoCosts(ready, decode, {first: prefill_ready}, {first: prefill})


def test_skips_a_rung_whose_build_cannot_hide() -> None:
    # 2K's window (1K tokens, 1 s) hides no 8 s build; 4K builds in 1 s. Skipping 2K
    # decodes 1K tokens on 4K (0.5 s more) instead of waiting ~7 s for 2K.
    ladder = Ladder((K, 2 * K, 4 * K, 8 * K))
    decision = choose(
        ladder,
        Request(16, 8 * K - 16),
        costs(
            {K: 1.0, 2 * K: 8.0, 4 * K: 1.0, 8 * K: 1.0},
            {K: 0.001, 2 * K: 0.001, 4 * K: 0.0015, 8 * K: 0.01},
        ),
        SERIAL,
    )
    assert decision.schedule.rungs == (K, 4 * K, 8 * K)
    assert any(r.startswith(f"skips {2 * K}") for r in decision.reasons)
    assert decision.chosen.finished_s < decision.fixed["I2"].finished_s - 5


def test_starts_bigger_when_the_prompt_rung_window_is_too_short() -> None:
    # A 1000-token prompt leaves 24 tokens on 1K: its successor's 5 s build waits there,
    # while starting on 2K costs its prefill graph and a slightly slower step.
    ladder = Ladder((K, 2 * K, 8 * K))
    decision = choose(
        ladder,
        Request(1000, 8 * K - 1000),
        costs(
            {K: 5.0, 2 * K: 5.0, 8 * K: 2.0},
            {K: 0.001, 2 * K: 0.0011, 8 * K: 0.012},
            prefill_ready=5.0,
        ),
        SERIAL,
    )
    assert decision.schedule.rungs[0] == 2 * K
    assert decision.schedule.rungs[-1] == 8 * K
    assert decision.reasons[0].startswith(f"starts on {2 * K} instead of {K}")


def two_ahead_case() -> tuple[Ladder, Request, AutoCosts]:
    # 1100's window is 76 tokens (1.5 s): the 5 s build of 4K hides only if it is
    # queued with 1100's, on entering 1K (20 s window; 16 s guarded, against 11.25 s).
    ladder = Ladder((K, 1100, 4 * K))
    return (
        ladder,
        Request(16, 4 * K - 16),
        costs({K: 1.0, 1100: 4.0, 4 * K: 5.0}, {K: 0.02, 1100: 0.02, 4 * K: 0.02}),
    )


def test_two_ahead_when_one_window_is_short() -> None:
    ladder, request, known = two_ahead_case()
    decision = choose(ladder, request, known, SERIAL)
    assert decision.schedule.rungs == (K, 1100, 4 * K)
    assert decision.schedule.starts[4 * K] == Start(Trigger.ENTER, K)
    assert decision.schedule.name == "two ahead"
    assert decision.chosen.wait_s == 0
    assert decision.fixed["I2"].wait_s > 4  # one ahead waits at 1100 -> 4K


def test_ties_go_to_the_latest_start() -> None:
    # Two ahead and "during the prefill" both hide every build here; the later wins.
    ladder, request, known = two_ahead_case()
    prefill_all = simulate(
        ahead((K, 1100, 4 * K), 2).__class__(
            (K, 1100, 4 * K), {1100: Start(Trigger.PREFILL), 4 * K: Start(Trigger.PREFILL)}
        ),
        known,
        request,
        SERIAL,
    )
    decision = choose(ladder, request, known, SERIAL)
    assert prefill_all.wait_s == 0
    assert decision.chosen.finished_s <= prefill_all.finished_s * (1 + TIE_RELATIVE) + TIE_S
    assert decision.schedule.at_prompt() == ()


def upfront_case() -> tuple[Ladder, AutoCosts]:
    # Before the prompt two builds run at once; while decoding, one. Short windows hide
    # nothing, so building 2K and 4K side by side up front is fastest.
    ladder = Ladder((K, 2 * K, 4 * K))
    return ladder, costs({K: 1.0, 2 * K: 5.0, 4 * K: 5.0}, {K: 0.001, 2 * K: 0.001, 4 * K: 0.003})


def test_up_front_when_the_foreground_builds_side_by_side() -> None:
    ladder, known = upfront_case()
    decision = choose(ladder, Request(16, 4 * K - 16), known, Lanes(2, 1))
    assert decision.schedule.upfront() == (2 * K, 4 * K)
    assert decision.chosen.finished_s < decision.fixed["I2"].finished_s - 1
    # One lane before the prompt too: up front gains nothing over the background.
    serial = choose(ladder, Request(16, 4 * K - 16), known, SERIAL)
    assert serial.schedule.upfront() == ()


def test_a_request_that_may_stop_early_builds_nothing_up_front() -> None:
    ladder, known = upfront_case()
    decision = choose(ladder, Request(16, 4 * K - 16, may_stop_early=True), known, Lanes(2, 1))
    assert decision.schedule.upfront() == ()
    assert abandoned(decision.schedule, 2 * K, pending=(4 * K,)) == (4 * K,)
    assert abandoned(decision.schedule, 4 * K, pending=()) == ()


def test_two_lanes_when_the_host_has_the_cores() -> None:
    # Each window (1 s) hides no 4 s build; two at once halve the waiting.
    ladder = Ladder((K, 2 * K, 3 * K, 4 * K))
    known = costs(
        {K: 1.0, 2 * K: 4.0, 3 * K: 4.0, 4 * K: 4.0},
        {K: 0.001, 2 * K: 0.001, 3 * K: 0.001, 4 * K: 0.001},
    )
    one = choose(ladder, Request(16, 4 * K - 16), known, Lanes(1, 1))
    two = choose(ladder, Request(16, 4 * K - 16), known, Lanes(1, 2))
    assert two.schedule.lanes == 2
    assert two.chosen.finished_s < one.chosen.finished_s - 0.5


def test_never_plans_past_the_reachable_tokens() -> None:
    ladder = Ladder((K, 2 * K, 4 * K, 8 * K))
    known = costs(dict.fromkeys(ladder, 1.0), dict.fromkeys(ladder, 0.01))
    decision = choose(ladder, Request(16, 1500), known, SERIAL)
    assert max(decision.schedule.rungs) == 2 * K
    assert all(max(t.schedule.rungs) <= 2 * K for t in decision.fixed.values())


def test_refuses_a_rung_with_no_cost() -> None:
    ladder = Ladder((K, 2 * K))
    with pytest.raises(BadRequestError, match="no cost for rung 2048"):
        choose(ladder, Request(16, 2000), costs({K: 1.0}, {K: 0.01, 2 * K: 0.01}), SERIAL)


def thin_slack_case() -> tuple[Ladder, Request, AutoCosts]:
    # One ahead hides 2K's 1 s build in 1K's 1.05 s window (525 tokens, slack +0.05 s);
    # B0 decodes them on 2K at a 2% slower step (+0.02 s) and builds nothing behind.
    ladder = Ladder((K, 2 * K))
    known = costs({K: 1.0, 2 * K: 1.0}, {K: 0.002, 2 * K: 0.00204})
    return ladder, Request(K - 525, K + 525), known


def test_a_thin_slack_counts_as_a_wait() -> None:
    # The sweep's unpredicted waits: a plan that leans on +0.02 s of slack waits when the
    # build runs a little slow or the window a little fast. Guarded, the plan predicts that
    # wait and takes the schedule whose slack does not depend on it.
    ladder, request, known = thin_slack_case()
    unguarded = choose(ladder, request, known, SERIAL, guard=1.0)
    assert unguarded.schedule.rungs == (K, 2 * K)  # the edge the guard is for
    assert unguarded.chosen.boundaries[0].slack_s == pytest.approx(0.05, abs=1e-6)
    decision = choose(ladder, request, known, SERIAL)
    assert decision.schedule.rungs == (2 * K,)
    assert decision.fixed["I2"].boundaries[0].wait_s > 0.2  # the wait it now predicts


DRIFT_LADDER = Ladder((K, 2 * K, 2 * K + 110, 4 * K))


def drift_case() -> tuple[AutoCosts, Request]:
    # One ahead hides 1 s builds everywhere: the tightest window, on 2K+110, is 1.1 s.
    known = costs(dict.fromkeys(DRIFT_LADDER, 1.0), dict.fromkeys(DRIFT_LADDER, 0.01))
    return known, Request(16, 2 * K + 160 - 16)


def test_replans_when_builds_run_slower_than_planned() -> None:
    known, request = drift_case()
    decision = choose(DRIFT_LADDER, request, known, SERIAL, guard=1.0)  # no guard: the edge
    assert decision.schedule.name == "one ahead"
    # 2K took 3 s instead of 1: 4K's build would no longer hide in 2K+110's window.
    slow = Observed(ready_s={2 * K: 3.0})
    change = replan(decision.schedule, known, request, 2 * K, (), (K,), slow)
    assert change is not None
    assert change.queue_now == (2 * K + 110, 4 * K)
    assert change.build_ratio == pytest.approx(3.0)


def test_replans_only_past_the_drift_threshold() -> None:
    known, request = drift_case()
    schedule = ahead(tuple(DRIFT_LADDER), 1)
    # 1.2x: 4K's build (1.2 s) would miss the 1.1 s window by 0.1 s, but 1.2x is within
    # the threshold (1.25x): measurement noise, not drift.
    slightly = Observed(ready_s={2 * K: 1.2})
    assert replan(schedule, known, request, 2 * K, (), (K,), slightly) is None
    change = replan(schedule, known, request, 2 * K, (), (K,), slightly, threshold=1.1)
    assert change is not None and change.queue_now == (2 * K + 110, 4 * K)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.05, 8.0), min_size=4, max_size=4),
    st.lists(st.floats(0.0005, 0.02), min_size=4, max_size=4),
    st.integers(1, 900),
)
def test_auto_is_never_predicted_slower_than_a_fixed_policy(
    ready: list[float], decode: list[float], prompt: int
) -> None:
    ladder = Ladder((K, 2 * K, 3 * K, 4 * K))
    known = costs(
        dict(zip(ladder, ready, strict=True)), dict(zip(ladder, sorted(decode), strict=True))
    )
    decision = choose(ladder, Request(prompt, 4 * K - prompt), known, SERIAL)
    best = min(t.finished_s for t in decision.fixed.values())
    assert decision.chosen.finished_s <= best * (1 + TIE_RELATIVE) + TIE_S


def test_plan_prints_auto_schedule_and_why() -> None:
    from click.testing import CliRunner

    import ovspec.cli.commands  # noqa: F401  (registers the commands)
    from ovspec.cli import cli

    flags = ["plan", "builtin:tiny", "--ladder", "32,64,128", "--prompt-tokens", "16"]
    flags += ["--compile-s", "0.5", "--decode-ms", "1"]
    text = CliRunner().invoke(cli, flags)
    assert text.exit_code == 0, text.output
    assert "auto: one rung on rungs 128" in text.output
    assert "skips 64: its build (0.62 s) does not hide" in text.output  # 0.5 s guarded
    assert "guarded: builds priced at 1.25x" in text.output
    document = CliRunner().invoke(cli, [*flags, "--json"])
    auto = json.loads(document.output)["auto"]
    assert auto["schedule"]["rungs"] == [128]
    assert auto["best_fixed"] == "B0" and auto["predicted_gain_s"] >= 0
    assert any(r.startswith("starts on 128 instead of 32") for r in auto["reasons"])


def exhaustive_best_s(ladder: Ladder, request: Request, known: AutoCosts) -> tuple[float, int]:
    """Every candidate simulated (no bound): the fastest finish, and how many there are."""
    from ovspec.runtime.autopolicy import GUARD_RATIO, _timings, reachable_rungs
    from ovspec.runtime.subladders import sub_ladders

    guarded = known.scaled(GUARD_RATIO, 1 / GUARD_RATIO)
    finishes = [
        simulate(schedule, guarded, request, SERIAL).finished_s
        for rungs in sub_ladders(reachable_rungs(ladder, request))
        for schedule in _timings(rungs, 1, request.may_stop_early)
    ]
    return min(finishes), len(finishes)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.05, 8.0), min_size=5, max_size=5),
    st.lists(st.floats(0.0005, 0.02), min_size=5, max_size=5),
    st.integers(1, 900),
)
def test_the_bound_skips_only_candidates_that_cannot_win(
    ready: list[float], decode: list[float], prompt: int
) -> None:
    ladder = Ladder((K, 2 * K, 3 * K, 4 * K, 5 * K))
    known = costs(
        dict(zip(ladder, ready, strict=True)), dict(zip(ladder, sorted(decode), strict=True))
    )
    request = Request(prompt, 5 * K - prompt)
    decision = choose(ladder, request, known, SERIAL)
    best_s, _ = exhaustive_best_s(ladder, request, known)
    assert decision.chosen.finished_s <= best_s * (1 + TIE_RELATIVE) + TIE_S


def test_the_bound_prunes_a_fine_ladder() -> None:
    # Eight rungs of 1 s builds in 0.1 s windows: every rung kept waits; the bound stops
    # the search after the few sub-ladders with almost no builds.
    ladder = Ladder(tuple(K * i for i in range(1, 9)))
    known = costs(dict.fromkeys(ladder, 1.0), dict.fromkeys(ladder, 0.0001))
    request = Request(16, 8 * K - 16)
    decision = choose(ladder, request, known, SERIAL)
    best_s, every = exhaustive_best_s(ladder, request, known)
    assert decision.chosen.finished_s == pytest.approx(best_s)
    assert decision.candidates < every / 10
