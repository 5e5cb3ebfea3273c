"""The overlap benchmark: slot schedule, pairing and statistics on synthetic step times
(a known shift is recovered, drift common to on and off cancels), the overlap fractions
read from bench results, the renderer, and a tiny run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ovspec.bench.overlap import analysis
from ovspec.bench.overlap.analysis import (
    Overlap,
    SlotPair,
    campaign_overlap,
    implied_cost,
    pair_slots,
    slot_on,
    summarize_load,
)
from ovspec.errors import BadRequestError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
SLOT = 10


def _synthetic(
    steps: int,
    shift: float,
    drift_per_step: float,
    noise: float,
    seed: int,
    capacities: list[int] | None = None,
) -> tuple[list[float], list[int], list[bool]]:
    """Step ms: 4 ms + a drift common to every step + noise, times (1 + shift) when on."""
    rng = np.random.default_rng(seed)
    on = [slot_on(i // SLOT) for i in range(steps)]
    times = [
        (4.0 + drift_per_step * i + rng.normal(0.0, noise)) * (1.0 + shift if on[i] else 1.0)
        for i in range(steps)
    ]
    return times, capacities or [512] * steps, on


def test_slots_alternate_off_on_on_off() -> None:
    assert [slot_on(j) for j in range(8)] == [False, True, True, False] * 2


def test_a_known_shift_is_recovered() -> None:
    pairs: list[SlotPair] = []
    for decode in range(4):
        pairs += pair_slots(*_synthetic(400, 0.05, 0.0, 0.05, seed=decode), SLOT, decode=decode)
    summary = summarize_load(pairs)
    assert summary.n_pairs == 4 * 20
    assert summary.t_test.ci_low < 0.05 < summary.t_test.ci_high
    assert summary.t_test.ci_low > 0.03
    assert summary.relative_change == pytest.approx(0.05, abs=0.01)


def test_drift_common_to_on_and_off_cancels() -> None:
    """A steep drift (the step slowing by 50% over the decode) and no load effect: the
    alternating pair order cancels it, and the estimate stays at 0."""
    pairs = pair_slots(*_synthetic(800, 0.0, 0.0025, 0.0, seed=0), SLOT)
    summary = summarize_load(pairs)
    assert abs(summary.relative_change) < 1e-3
    assert summary.t_test.ci_low < 0 < summary.t_test.ci_high
    # Each pair alone is biased by the drift, one way or the other by its order.
    assert {p.ratio > 1 for p in pairs} == {True, False}


def test_drift_with_a_shift_still_recovers_the_shift() -> None:
    pairs = pair_slots(*_synthetic(800, 0.03, 0.0025, 0.02, seed=1), SLOT)
    assert summarize_load(pairs).relative_change == pytest.approx(0.03, abs=0.005)


def test_pairs_never_straddle_a_rung_boundary() -> None:
    capacities = [512] * 35 + [1024] * 45
    pairs = pair_slots(*_synthetic(80, 0.0, 0.0, 0.01, seed=2, capacities=capacities), SLOT)
    # Slots 0-1 and 4-5, 6-7 are within one band; 2-3 holds steps of both.
    assert [(p.slot, p.capacity_tokens) for p in pairs] == [(0, 512), (4, 1024), (6, 1024)]


def test_a_slot_that_ran_in_the_wrong_state_is_dropped() -> None:
    times, capacities, on = _synthetic(40, 0.0, 0.0, 0.01, seed=3)
    on[SLOT + 3] = not on[SLOT + 3]  # a switch that came late, inside slot 1
    assert [p.slot for p in pair_slots(times, capacities, on, SLOT)] == [2]


def test_pair_slots_refuses_lists_of_different_lengths() -> None:
    with pytest.raises(BadRequestError, match="capacities"):
        pair_slots([1.0, 2.0], [512], [False, True], 1)


def test_overlap_fractions_from_bench_results() -> None:
    run = {
        "protocol": "I2",
        "variant": "cold-split",
        "ready_cost_s": {"decode@512": 1.0, "decode@1024": 1.2, "decode@2048": 1.3},
        "compile_s_by_graph": {"decode@512": 0.5, "decode@1024": 0.5, "decode@2048": 0.5},
        "compile_background_s": 1.4,  # 1.0 s compiles + 0.4 s import and warm-up
        "critical_path_s": 12.0,
        "time_to_first_token_s": 2.0,
    }
    shared = {**run, "variant": "cold-shared", "compile_background_s": 9.0}
    i1 = {**run, "protocol": "I1", "compile_background_s": 9.0}
    found = campaign_overlap({"runs": [run, shared, i1]}, "test")
    assert found is not None
    assert found.import_warmup == pytest.approx(0.04)
    assert found.host_build == pytest.approx((2.5 - 0.4) / 10.0)
    assert campaign_overlap({"runs": [shared, i1]}, "test") is None


def test_the_committed_campaign_has_overlap_fractions() -> None:
    bench = json.loads((DOCS / "results" / "bench.json").read_text(encoding="utf-8"))
    found = campaign_overlap(bench, "committed")
    assert found is not None
    assert 0.0 < found.import_warmup < found.host_build < 1.0


def test_implied_cost_weights_each_load_by_its_overlap() -> None:
    build = summarize_load([SlotPair(0, j, 512, 4.0, 4.0 * r) for j, r in enumerate([1.01, 1.03])])
    imp = summarize_load([SlotPair(0, j, 512, 4.0, 4.0 * r) for j, r in enumerate([1.04, 1.06])])
    implied = implied_cost(build, imp, Overlap(0.5, 0.1, "test"))
    assert implied.change == pytest.approx(0.02 * 0.5 + 0.05 * 0.1)
    assert implied.low < implied.change < implied.high
    assert implied_cost(build, None, Overlap(0.5, 0.1, "test")).change == pytest.approx(0.01)


def _document(control_shift: float) -> dict[str, object]:
    def rows(shift: float, seed: int) -> list[list[float]]:
        times, capacities, on = _synthetic(200, shift, 0.0, 0.05, seed=seed)
        return [p.to_json() for p in pair_slots(times, capacities, on, SLOT)]

    return {
        "command": "python tools/bench_overlap.py --decodes 1",
        "config": {
            "model": "builtin:small",
            "ladder": [512, 1024, 2048],
            "prompt_tokens": 128,
            "new_tokens": 200,
            "decodes": 1,
            "slot_steps": SLOT,
            "loads": ["build", "import", "memcpy"],
            "split": {"device": [0], "host": [1]},
            "properties": {},
            "seed": 0,
        },
        "loads": {
            name: {
                "pairs": rows(shift, seed),
                "decode_s": [1.0],
                "on_s": 0.5,
                "background_cpu_s": 0.45,
            }
            for seed, (name, shift) in enumerate(
                [("build", 0.0), ("import", 0.02), ("memcpy", control_shift)]
            )
        },
        "overlap": Overlap(0.3, 0.06, "test fractions").to_json(),
        "environment": "a test machine.",
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [1.5, 1.0, 1.0],
        "wall_s": 60.0,
    }


def test_the_page_shows_the_command_the_loads_and_what_they_imply() -> None:
    page = analysis.render(_document(0.3))
    assert "python tools/bench_overlap.py --decodes 1" in page
    for name in ("build", "import", "memcpy"):
        assert f"| {name} | 10 |" in page
    assert "| 90% |" in page  # the background's CPU while on
    assert "Yes: the memcpy loop slows the step" in page
    assert "blind" not in page
    assert "test fractions" in page and "1.00, 1.00, 1.00 before" in page


def test_the_page_says_blind_when_the_control_shows_nothing() -> None:
    page = analysis.render(_document(0.0))
    assert "**No: the measurement is blind.**" in page


def test_the_page_without_overlap_fractions_says_so() -> None:
    document = _document(0.3)
    document["overlap"] = None
    assert "No overlap fractions were available" in analysis.render(document)


@pytest.mark.skipif(
    len(__import__("os").sched_getaffinity(0)) < 2, reason="the split needs 2 usable cores"
)
def test_a_tiny_run_end_to_end(tiny_dir: Path, tmp_path: Path) -> None:
    from ovspec.bench.overlap.runner import OverlapConfig, run_overlap
    from ovspec.compile.split import CoreSplit
    from ovspec.ir.model_dir import ModelDir
    from ovspec.ir.reference import EXACT_CPU_PROPERTIES
    from ovspec.ladder import Ladder

    split = CoreSplit.default()
    assert split is not None
    config = OverlapConfig(
        model=ModelDir.open(tiny_dir),
        model_name="tiny",
        ladder=Ladder.parse("32,64"),
        prompt_tokens=12,  # the 32 -> 64 boundary falls inside pair 2 (steps 17-24)
        new_tokens=48,
        decodes=1,
        slot_steps=4,
        loads=("build", "import", "memcpy"),
        split=split,
        work_dir=tmp_path,
        properties=dict(EXACT_CPU_PROPERTIES),
    )
    document = run_overlap(config, Overlap(0.3, 0.06, "test"))
    document["command"] = "test"
    for name in config.loads:
        entry = document["loads"][name]
        # 48 steps = 6 pairs of 4-step slots; one holds the 32 -> 64 boundary.
        assert len(entry["pairs"]) == 5
        assert entry["on_s"] > 0
        assert entry["background_cpu_s"] >= 0
    # The loads really ran while on: the scheduler counts their threads' run time in
    # nanoseconds (clock ticks of 10 ms had shown 0 for all three in CI).
    assert sum(document["loads"][n]["background_cpu_s"] for n in config.loads) > 0
    assert "| memcpy | 5 |" in analysis.render(document)
    assert list(tmp_path.iterdir()) == []  # scratch removed


TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_overlap.py"


def test_the_tool_refuses_bad_overlap_fractions_in_one_line() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(TOOL), "--overlap", "0.3"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "bench_overlap: --overlap '0.3': give HOST_BUILD,IMPORT, e.g. 0.3,0.06"
    ]
    assert "Traceback" not in done.stderr
