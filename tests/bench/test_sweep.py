"""The sweep's grid and ladder parsing, a tiny sweep run for real (every arm, auto's
plans kept) and the auto verdicts' bound (the I1/I2 page is covered by test_pages)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ovspec.bench.sweep.autopage import auto_section, auto_verdict
from ovspec.bench.sweep.page import render
from ovspec.bench.sweep.runner import SweepGrid, parse_ladders, run_sweep
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder


def test_the_grid_is_every_preset_ladder_and_precision() -> None:
    ladders = parse_ladders(["doubling=128,256,512", "fine=128,256,384,512"])
    assert ladders == (
        ("doubling", Ladder((128, 256, 512))),
        ("fine", Ladder((128, 256, 384, 512))),
    )
    grid = SweepGrid(("tiny", "small", "kv-heavy"), ladders, ("none", "int8", "int4"), 64, 3)
    cells = grid.cells()
    assert len(cells) == 18 and len(set(cells)) == 18
    assert cells[0] == ("tiny", "doubling", Ladder((128, 256, 512)), "none")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repetitions": 1}, "--repetitions 2 or more"),
        ({"prompt_tokens": 512}, "does not fit ladder"),
        ({"presets": ()}, "at least one preset"),
    ],
)
def test_the_grid_refuses_what_it_cannot_run(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "presets": ("tiny",),
        "ladders": parse_ladders(["d=128,256,512"]),
        "compressions": ("none",),
        "prompt_tokens": 64,
        "repetitions": 3,
    }
    with pytest.raises(BadRequestError, match=message):
        SweepGrid(**{**base, **kwargs})  # type: ignore[arg-type]


def test_ladders_need_a_name() -> None:
    with pytest.raises(BadRequestError, match="NAME=RUNGS"):
        parse_ladders(["128,256"])


# -- a tiny sweep, run for real: every arm, auto's plans kept, the page from samples -------


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("sweep")
    grid = SweepGrid(
        ("tiny",), parse_ladders(["d=32,64,128"]), ("none",), prompt_tokens=16, repetitions=2
    )
    return run_sweep(
        grid,
        lambda preset: resolve_model(f"builtin:{preset}", work / "models"),
        work / "runs",
        CoreSplit.default(),
        EXACT_CPU_PROPERTIES,
    )


def test_a_tiny_sweep_keeps_every_sample_and_auto_plan(tiny_sweep: dict[str, Any]) -> None:
    (cell,) = tiny_sweep["cells"]
    assert tiny_sweep["protocols"] == ["B0", "I1", "I2", "auto"]
    runs = Counter(r["protocol"] for r in cell["runs"])
    assert runs == {"B0": 2, "I1": 2, "I2": 2, "auto": 2}  # samples, not summaries
    assert sorted(cell["auto_plans"]) == ["0", "1"]
    for plan in cell["auto_plans"].values():
        assert plan["schedule"]["rungs"][-1] == 128 and plan["predicted"]["boundaries"] is not None
    assert set(cell["calibration"]["ready_s"]) == {"32", "64", "128"}
    page = render(tiny_sweep)
    assert "## auto against the fixed policies" in page
    assert "| tiny / d / none |" in page.split("## auto against the fixed policies")[1]
    assert "Waits the plan predicted:" in page


def test_auto_verdicts_follow_the_interval_bound(tiny_sweep: dict[str, Any]) -> None:
    (cell,) = tiny_sweep["cells"]
    assert auto_verdict(cell) is not None

    def with_auto(scale: float, jitter: float) -> dict[str, Any]:
        # Scripted critical paths (a real tiny run's spread would decide the interval):
        # B0 the best fixed policy, auto ``scale`` times it.
        def path_s(run: dict[str, Any]) -> float:
            b0 = 1.0 + 0.01 * run["repetition"]
            if run["protocol"] == "auto":
                return b0 * scale + jitter * run["repetition"]
            return b0 if run["protocol"] == "B0" else 2.0 * b0

        runs = [{**r, "critical_path_s": path_s(r)} for r in cell["runs"]]
        return {**cell, "runs": runs}

    slower = auto_verdict(with_auto(1.10, 0.003))
    faster = auto_verdict(with_auto(0.90, 0.003))
    assert slower is not None and not slower.not_worse
    assert faster is not None and faster.not_worse


def test_the_half_fraction_meets_every_pair_of_levels_once() -> None:
    ladders = parse_ladders(["doubling=128,256,512", "fine=128,256,384,512"])
    grid = SweepGrid(("small", "kv-heavy"), ladders, ("none", "int4"), 64, 5, half_fraction=True)
    cells = [(p, name, c) for p, name, _, c in grid.cells()]
    assert len(cells) == 4
    for i, j in ((0, 1), (0, 2), (1, 2)):  # each pair of factors: all 4 level pairs, once
        assert len({(cell[i], cell[j]) for cell in cells}) == 4
    assert ("small", "doubling", "none") in cells


def committed_like(wall_s: float) -> dict[str, Any]:
    # One cell, one run per arm: critical paths 10 s (I1: 12 s), 2 s of it past rung 256.
    def run(protocol: str, path_s: float) -> dict[str, Any]:
        bands = [{"low_tokens": 0, "infer_s": 1.0}, {"low_tokens": 256, "infer_s": 2.0}]
        return {"protocol": protocol, "critical_path_s": path_s, "bands": bands}

    runs = [run(p, 12.0 if p == "I1" else 10.0) for p in ("B0", "I1", "I2", "auto")]
    cell = {"preset": "tiny", "ladder_name": "d", "ladder": [128, 256, 512]}
    return {
        "wall_s": wall_s,
        "cells": [{**cell, "compression": "none", "runs": runs, "calibration": {}}],
    }


def test_the_estimate_adds_each_runs_overhead_and_drops_the_bands_past_the_top() -> None:
    from ovspec.bench.sweep.estimate import estimate, run_overhead_s

    # 4 runs (42 s of paths) and auto's calibration (the committed run's: I1, 12 s), 2 s
    # each beyond
    document = committed_like(wall_s=42.0 + 12.0 + 5 * 2.0)
    document["cells"][0]["calibration"] = {"ready_s": {}}
    assert run_overhead_s(document) == pytest.approx(2.0)
    grid = SweepGrid(("tiny",), parse_ladders(["d=128,256"]), ("none",), 64, 3)
    (cell,) = estimate(document, grid)
    # per repetition: 3 arms of 8 s and I1's 10 s, each + 2 s; auto's calibration (an
    # I2 run) once more
    assert cell.seconds == pytest.approx(3 * (3 * 10.0 + 12.0) + 10.0)
    other = SweepGrid(("small",), parse_ladders(["d=128,256"]), ("none",), 64, 3)
    assert estimate(document, other)[0].seconds is None


def test_the_page_says_how_many_pairs_would_resolve_two_percent(
    tiny_sweep: dict[str, Any],
) -> None:
    (cell,) = tiny_sweep["cells"]

    def with_spread(jitter: float) -> dict[str, Any]:
        # auto equal to B0 on average, its pairs spread by ``jitter`` seconds either way.
        def path_s(run: dict[str, Any]) -> float:
            b0 = 1.0 + 0.01 * run["repetition"]
            if run["protocol"] == "auto":
                return b0 + jitter * (1 if run["repetition"] % 2 else -1)
            return b0 if run["protocol"] == "B0" else 2.0 * b0

        return {**cell, "runs": [{**r, "critical_path_s": path_s(r)} for r in cell["runs"]]}

    tight, loose = auto_verdict(with_spread(0.0001)), auto_verdict(with_spread(0.05))
    assert tight is not None and loose is not None
    assert tight.pairs_to_resolve_not_worse is not None
    assert loose.pairs_to_resolve_not_worse is not None
    assert tight.pairs_to_resolve_not_worse <= 2 < loose.pairs_to_resolve_not_worse
    page = "\n".join(auto_section([with_spread(0.05)]))
    assert f"| {loose.pairs_to_resolve_not_worse} |" in page
    assert "Resolution: the sweep ran 2 pairs per cell" in page and "0 of 1 cells" in page


def test_the_page_shows_autos_predicted_last_token_beside_the_measured(
    tiny_sweep: dict[str, Any],
) -> None:
    (cell,) = tiny_sweep["cells"]
    plans = {
        k: {**p, "predicted": {**p["predicted"], "finished_s": 1.0 + int(k)}}
        for k, p in cell["auto_plans"].items()
    }
    runs = [
        {**r, "critical_path_s": 3.0 + r["repetition"]} if r["protocol"] == "auto" else r
        for r in cell["runs"]
    ]
    verdict = auto_verdict({**cell, "auto_plans": plans, "runs": runs})
    assert verdict is not None
    assert verdict.predicted_s == pytest.approx(1.5) and verdict.measured_s == pytest.approx(3.5)
    page = "\n".join(auto_section([{**cell, "auto_plans": plans, "runs": runs}]))
    assert "| 1.50 → 3.50 |" in page
