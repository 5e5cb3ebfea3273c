"""tools/bench_serve.py on the tiny model with a four-request trace and one repetition:
the structure of its results (raw samples for every arm, every request's tokens), the
page rendered from them, the plot; and the verdict rule on the ratio's interval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ovspec.bench.serve.page import ratio_interval, render, verdict
from ovspec.bench.serve.runner import ARMS
from ovspec.bench.serve.trace import TraceSpec

ROOT = Path(__file__).resolve().parents[2]


def test_the_tool_runs_every_arm_on_a_tiny_trace(tmp_path: Path) -> None:
    out = tmp_path / "pages"
    command = [sys.executable, str(ROOT / "tools" / "bench_serve.py"), "--model", "builtin:tiny"]
    command += ["--ladder", "32,64", "--clients", "2", "--requests", "4", "--rate", "50"]
    command += ["--prompt-tokens", "4,12", "--output-tokens", "4,10", "--repetitions", "1"]
    command += ["--work-dir", str(tmp_path / "work"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results" / "serve.json").read_text())
    trace = TraceSpec(4, 50.0, (4, 12), (4, 10)).draw(2048)
    assert set(results["runs"]) == set(ARMS)
    for arm in ARMS:
        (run,) = results["runs"][arm]
        counts = [len(r["token_s"]) for r in run["requests"]]
        assert counts == [r.max_tokens for r in trace], arm  # ignore_eos: every token came
        for request in run["requests"]:
            assert request["arrival_s"] <= request["sent_s"] <= request["token_s"][0]
            assert request["token_s"] == sorted(request["token_s"])
    assert results["runs"]["ovspec-batched"][0]["max_sequences"] == 2
    assert results["runs"]["ovspec-batched"][0]["kv"], "the server's KV was sampled"
    page = (out / "serve.md").read_text()
    assert page == render(results)  # the page is the saved samples' rendering
    assert "| ovspec-batch-1 | 1 |" in page and "| genai-cb | 2 |" in page
    assert "one repetition" in page and (out / "serve-kv.png").stat().st_size > 0


def test_the_verdict_follows_the_interval_bound() -> None:
    assert "lower bound" in verdict([2.4, 2.5, 2.6], 2.0)
    assert "upper bound" in verdict([1.2, 1.3, 1.25], 2.0)
    assert "straddles" in verdict([1.5, 2.8, 2.1], 2.0)
    mean, low, high = ratio_interval([2.0, 2.0 * 1.1]) or (0.0, 0.0, 0.0)
    assert low < mean < high and mean == pytest.approx((2.0 * 2.2) ** 0.5)


def test_a_bad_range_is_one_line_and_exit_2(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "tools" / "bench_serve.py"), "--prompt-tokens", "9"]
    done = subprocess.run(
        [*command, "--work-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
