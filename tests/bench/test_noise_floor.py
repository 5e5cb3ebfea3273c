"""The noise-floor probe run for real on the tiny model (fresh processes, every step kept)
and its page's figures on scripted samples."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from ovspec.bench.noise.page import aa_pairs, block_means, render
from ovspec.bench.noise.probe import ProbeRequest
from ovspec.bench.noise.runner import results_document, run_processes
from ovspec.compile.split import usable_cores
from ovspec.errors import OvspecError, TrialError
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

ENV = {
    "cpu_model": "test CPU",
    "usable_cores": 2,
    "openvino": "test",
    "git_commit": "abc",
    "load_average_start": [0.0, 0.0, 0.0],
}


def _request(model_dir: str, steps: int) -> ProbeRequest:
    return ProbeRequest(
        model_dir=model_dir,
        capacity_tokens=32,
        warmup_steps=2,
        steps=steps,
        control_steps=5,
        core=min(usable_cores()),
        properties={**EXACT_CPU_PROPERTIES, "INFERENCE_NUM_THREADS": "1"},
    )


def test_fresh_processes_keep_every_step_and_the_page_renders(tmp_path: Path) -> None:
    model_dir = resolve_model("builtin:tiny", tmp_path / "models")
    request = _request(str(model_dir.root), steps=20)
    runs = run_processes(request, 2, tmp_path / "runs")
    assert [r["index"] for r in runs] == [0, 1]
    for run in runs:
        assert len(run["step_s"]) == 20 and len(run["control_s"]) == 5
        assert all(s > 0 for s in run["step_s"])
        assert run["inference_num_threads"] == 1  # what the device reports, not assumed
    document = results_document(
        request,
        runs,
        model="builtin:tiny",
        command="python tools/noise_floor.py",
        environment=ENV,
        wall_s=1.0,
    )
    assert "model_dir" not in document["request"]  # no scratch path in committed results
    page = render(document)
    assert "| 1 |" in page and "## What an A/A comparison resolves" in page


def test_a_failing_probe_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OvspecError, match=r"noise probe 0 failed .*no-model"):
        run_processes(_request(str(tmp_path / "no-model"), 5), 2, tmp_path / "runs")


def _document(means_ms: list[float]) -> dict[str, Any]:
    runs = [
        {
            "index": i,
            "step_s": [m / 1e3] * 200,
            "control_s": [1e-4] * 9 + [1.1e-4],
            "inference_num_threads": 1,
        }
        for i, m in enumerate(means_ms)
    ]
    request = _request("unused", 200)
    return results_document(request, runs, model="m", command="c", environment=ENV, wall_s=60.0)


def test_the_spread_and_the_aa_interval_come_from_the_samples() -> None:
    steady_ms, spread_ms = [2.0, 2.0, 2.0, 2.01], [2.0, 2.4, 2.2, 2.0]
    steady, spread = render(_document(steady_ms)), render(_document(spread_ms))
    for means, page in ((steady_ms, steady), (spread_ms, spread)):
        cv = statistics.stdev(means) / statistics.fmean(means)  # sample SD, not population
        assert f"decode step {100 * cv:.1f}%" in page
    summary = aa_pairs([2.0, 2.4, 2.2, 2.0])
    assert summary.n_pairs == 2
    assert summary.mean_a == pytest.approx(2.1) and summary.mean_b == pytest.approx(2.2)
    assert f"{100 * summary.relative_change:+.1f}%" in spread


def test_block_means_drop_the_partial_block() -> None:
    assert block_means([1.0] * 100 + [3.0] * 100 + [9.0] * 50) == [1.0, 3.0]


def test_the_page_says_why_there_is_no_aa_interval() -> None:
    with pytest.raises(TrialError, match="3 processes make 1 A/A pair"):
        aa_pairs([2.0, 2.1, 2.2])
    page = render(_document([2.0, 2.4, 2.2, 2.0]))  # every control mean the same
    assert "- control: no A/A interval: all 2 paired differences are identical" in page


def test_the_within_process_drift_is_the_cv_of_block_means() -> None:
    document = _document([2.0, 2.0, 2.1, 2.0])
    for run in document["processes"]:  # two 100-step blocks, 1.0 and 1.2 ms
        run["step_s"] = [1e-3] * 100 + [1.2e-3] * 100
    drift = statistics.stdev([1.0, 1.2]) / statistics.fmean([1.0, 1.2])
    assert f"{100 * drift:.1f}%, at most {100 * drift:.1f}%" in render(document)
