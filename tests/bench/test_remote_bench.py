"""The remote tier benchmark: its arms' order, its paired ratios, its page (rendered from
the committed results file, never edited), and one small real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from s3server import BUCKET

from ovspec.bench.common.pages import render_saved, results_path
from ovspec.bench.remote import runner
from ovspec.bench.remote.page import render, summarize
from ovspec.bench.remote.runner import Arm, Settings, run_benchmark
from ovspec.ladder import Ladder
from ovspec.testing.seaweed import ADMIN, SeaweedServer

PAGES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_every_arm_takes_every_position_equally() -> None:
    orders = [runner._order(k) for k in range(3)]
    for position in range(3):
        assert {order[position] for order in orders} == set(Arm)


def fake_results(first_token_s: dict[str, list[float]]) -> dict[str, object]:
    runs = [
        {
            "arm": arm,
            "repeat": k,
            "position": ([a.value for a in Arm].index(arm) - k) % len(Arm),  # as _order
            "first_token_s": s,
            "exit_s": s + 0.3,
            "token": "7",
            "compiled": 2 if arm == "cold" else 0,
            "fetched": 2 if arm == "warm_remote" else 0,
            "fetched_bytes": 1000 if arm == "warm_remote" else 0,
        }
        for arm, values in first_token_s.items()
        for k, s in enumerate(values)
    ]
    load = [1.0, 1.0, 1.0]
    return {
        "command": "python tools/bench_remote.py",
        "wall_s": 60.0,
        "environment": {
            "cpu_model": "cpu",
            "usable_cores": 2,
            "openvino": "2026",
            "ovspec": "0.1",
            "git_commit": "abc",
            "date_utc": "today",
            "load_average_start": load,
            "load_average_end": load,
        },
        "settings": {
            "model": "builtin:tiny",
            "ladder": [32, 64],
            "phases": "decode,prefill",
            "chunk_tokens": 16,
            "prompt_tokens": 4,
            "server": "SeaweedFS",
        },
        "ladder_build": {
            "specializations": 4,
            "compile_s": 2.0,
            "blob_bytes": 4096,
            "uploaded": 4,
            "uploaded_bytes": 4096,
        },
        "ladder_pull": {"moved_bytes": 4096, "wall_s": 0.5, "counts": {"pulled": 4}},
        "runs": runs,
    }


def test_ratios_are_paired_within_each_repeat() -> None:
    results = fake_results(
        {"cold": [10.0, 20.0], "warm_remote": [2.0, 5.0], "warm_local": [1.0, 4.0]}
    )
    s = summarize(results)
    assert s["cold_over_remote"][0].samples == (5.0, 4.0)
    assert s["remote_over_local"][0].samples == (2.0, 1.25)
    assert s["first_token_s"]["cold"].median == 15.0
    interval = s["cold_over_remote"][1]
    assert interval is not None and abs(interval.estimate - (5.0 * 4.0) ** 0.5) < 1e-9
    assert interval.low < 4.0 and interval.high > 5.0  # two pairs: a wide interval
    page = render(results)
    assert "cold compile / warm remote: 4.47× [95% CI " in page
    assert "per repeat 4.50 (4.00–5.00)×" in page
    assert "do not edit" in page
    assert "One host" in page and "second machine all ran on this machine" in page


def test_the_page_names_the_order_the_arms_ran_in() -> None:
    times = {"cold": [1.0, 2.0], "warm_remote": [1.0, 1.0], "warm_local": [1.0, 1.0]}
    two = render(fake_results(times))
    assert "positions are not balanced" in two
    times = {"cold": [3.0, 2.0, 4.0], "warm_remote": [1.0, 1.5, 1.2], "warm_local": [1.0, 1.1, 1.3]}
    three = render(fake_results(times))
    assert "each arm ran 1 times in each position" in three


def test_the_committed_page_is_rendered_from_its_results() -> None:
    if not results_path(PAGES, "remote").exists():
        pytest.fail("docs/benchmarks/results/remote.json is missing: run tools/bench_remote.py")
    assert render_saved(PAGES, "remote") == (PAGES / "remote.md").read_text(encoding="utf-8")


def test_a_small_run_end_to_end(seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_reference=str(tiny_dir),
        models_dir=tmp_path / "models",
        ladder=Ladder((32, 64)),
        phases="decode,prefill",
        chunk_tokens=16,
        prompt_tokens=4,
        repeats=1,
        work_dir=tmp_path,
        endpoint=seaweed.endpoint,
        access_key=ADMIN.access_key,
        secret_key=ADMIN.secret_key,
        bucket=BUCKET,
    )
    results = run_benchmark(settings, lambda _message: None)
    by_arm = {r["arm"]: r for r in results["runs"]}
    assert by_arm["cold"]["compiled"] == 2 and by_arm["cold"]["fetched"] == 0
    remote = by_arm["warm_remote"]
    stderr = (tmp_path / "warm_remote-0.stderr").read_text(encoding="utf-8")
    assert remote["compiled"] == 0 and remote["fetched"] == 2, stderr
    assert by_arm["warm_local"]["compiled"] == 0 and by_arm["warm_local"]["fetched"] == 0
    assert results["ladder_build"]["uploaded"] == 4
    assert results["ladder_pull"]["counts"] == {"pulled": 4}
    json.dumps(results)  # a results file
    assert "warm remote" in render(results)
