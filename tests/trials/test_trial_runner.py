"""A/B compile trials: a small real trial (resumed mid-way), the results file's
promises (identity, torn lines, no duplicates), the environment guard, and the report
built from synthetic runs. No assertion looks at how long anything took."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ovspec.errors import BadRequestError, DeviceError, TrialError
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.specialize import Phase
from ovspec.ladder import Ladder
from ovspec.stats.orders import Arm
from ovspec.trials.arms import make_arm
from ovspec.trials.records import (
    WARMUP_PAIRS,
    ResultsFile,
    RunRecord,
    TrialPlan,
    model_digest,
    specializations_for,
)
from ovspec.trials.report import (
    BlobVerdict,
    build_report,
    format_report,
    report_to_dict,
)
from ovspec.trials.runner import TrialProgress, run_trial

# INFERENCE_NUM_THREADS cannot change a CPU blob (tests/test_devices.py proves it):
# two arms that differ only there must export identical bytes.
NEUTRAL_A = [("INFERENCE_NUM_THREADS", "1")]
NEUTRAL_B = [("INFERENCE_NUM_THREADS", "2")]


def make_plan(
    model: Path,
    *,
    pairs: int = 2,
    seed: int = 0,
    rungs: str = "32",
    device: str = "CPU",
    a: Sequence[tuple[str, str]] = NEUTRAL_A,
    b: Sequence[tuple[str, str]] = NEUTRAL_B,
) -> TrialPlan:
    model_dir = ModelDir.open(model)
    return TrialPlan(
        model=model_dir,
        model_digest=model_digest(model_dir),
        specializations=specializations_for(Ladder.parse(rungs), Phase.DECODE, 1),
        device=device,
        arm_a=make_arm(Arm.A, properties=a),
        arm_b=make_arm(Arm.B, properties=b),
        pairs=pairs,
        seed=seed,
    )


@dataclass(frozen=True)
class NeutralTrial:
    plan: TrialPlan
    path: Path
    first: TrialProgress  # stopped after 2 runs
    second: TrialProgress  # resumed to the end
    third: TrialProgress  # nothing left to run


@pytest.fixture(scope="module")
def neutral(qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NeutralTrial:
    plan = make_plan(qwen2_dir)
    path = tmp_path_factory.mktemp("trial") / "neutral.jsonl"
    first = run_trial(plan, path, max_runs=2)
    second = run_trial(plan, path)
    third = run_trial(plan, path)
    return NeutralTrial(plan, path, first, second, third)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


# --------------------------------------------------------------------- a real trial


def test_an_interrupted_trial_continues_where_it_stopped(neutral: NeutralTrial) -> None:
    total = (neutral.plan.pairs + WARMUP_PAIRS) * 2
    assert (neutral.first.ran, neutral.first.done, neutral.first.complete) == (2, 2, False)
    assert (neutral.second.ran, neutral.second.done, neutral.second.complete) == (
        total - 2,
        total,
        True,
    )
    assert (neutral.third.ran, neutral.third.complete) == (0, True)
    lines = read_lines(neutral.path)
    assert lines[0]["kind"] == "header" and lines[0]["seed"] == 0
    runs = lines[1:]
    keys = [(r["pair"], r["specialization"], r["arm"]) for r in runs]
    assert len(keys) == total == len(set(keys))
    # The file holds the runs in plan order, each pair's first arm first.
    expected = [p.key for p in neutral.plan.schedule()]
    assert keys == expected
    assert [r["warmup"] for r in runs] == [r["pair"] < WARMUP_PAIRS for r in runs]


def test_each_run_records_what_loaded_and_no_cache(neutral: NeutralTrial) -> None:
    for record in neutral.second.records:
        env = record.environment
        libraries = env["libraries"]
        assert any("libopenvino.so" in path for path in libraries)
        assert any("libopenvino_intel_cpu_plugin" in path for path in libraries)
        assert all(len(h) == 32 for h in libraries.values())
        assert env["openvino"] and env["device_version"] and env["host"]
        assert "CACHE_DIR" not in record.properties_applied
        assert record.blob_bytes > 0 and len(record.blob_xxh3) == 32


def test_neutral_arms_export_identical_blobs_and_the_report_has_every_figure(
    neutral: NeutralTrial,
) -> None:
    report = build_report(neutral.plan, neutral.second.records, neutral.path)
    (rung,) = report.rungs
    assert report.overall is None  # one rung: the overall row would repeat it
    assert rung.verdict is BlobVerdict.IDENTICAL and rung.identical_pairs == 2
    assert (rung.a_blob_variants, rung.b_blob_variants) == (1, 1)
    for summary in (rung.wall, rung.cpu):
        assert summary.n_pairs == 2
        assert summary.sign_flip.is_exact and summary.sign_flip.min_attainable_p == 0.5
    document = report_to_dict(report)
    json.dumps(document)  # JSON-ready
    wall = document["rungs"][0]["wall"]
    for key in ("n_pairs", "mean_diff", "median_diff", "relative_change", "b_faster_pairs"):
        assert key in wall
    assert {"ci_low", "ci_high", "p_value"} <= set(wall["t_test"])
    assert {"p_value", "min_attainable_p"} <= set(wall["sign_flip"])
    assert document["arms"]["A"]["runs"] == 3 and document["arms"]["B"]["runs"] == 3
    text = "\n".join(format_report(report))
    for phrase in ("95% CI of B−A", "sign-flip p", "min p", "2/2", "identical"):
        assert phrase in text
    assert "cannot reach a sign-flip p below 0.5" in text
    assert "byte-identical OpenVINO libraries" in text  # same build: properties-only A/B


def test_more_pairs_extend_a_trial_with_the_same_orders(
    neutral: NeutralTrial, tmp_path: Path
) -> None:
    path = tmp_path / "grow.jsonl"
    shutil.copy(neutral.path, path)
    longer = replace(neutral.plan, pairs=3)
    assert longer.orders()[: neutral.plan.pairs + 1] == neutral.plan.orders()
    progress = run_trial(longer, path, max_runs=1)
    assert progress.ran == 1
    (new,) = [r for r in progress.records if r.pair == 3]
    assert new.arm is longer.orders()[3][0]


def test_a_torn_last_line_is_dropped_and_rerun(neutral: NeutralTrial, tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    shutil.copy(neutral.path, path)
    intact = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"kind": "run", "pair": 2, "wall')
    file = ResultsFile(path, neutral.plan.header(), neutral.plan.identity())
    assert len(file.load()) == len(neutral.second.records)
    assert path.read_bytes() == intact


def test_a_damaged_line_is_an_error_not_a_skip(neutral: NeutralTrial, tmp_path: Path) -> None:
    path = tmp_path / "damaged.jsonl"
    lines = neutral.path.read_text().splitlines()
    lines[2] = "not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TrialError, match="line 3 is not JSON"):
        run_trial(neutral.plan, path)


def test_duplicate_runs_are_refused(neutral: NeutralTrial, tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    lines = read_lines(neutral.path)
    write_lines(path, [*lines, lines[-1]])
    with pytest.raises(TrialError, match="twice"):
        run_trial(neutral.plan, path)


def test_a_file_from_another_trial_is_refused(neutral: NeutralTrial) -> None:
    before = neutral.path.read_bytes()
    with pytest.raises(TrialError, match=r"made by a different trial \(seed: 0 vs 7\)"):
        run_trial(replace(neutral.plan, seed=7), neutral.path)
    other_arm = replace(neutral.plan, arm_b=make_arm(Arm.B, properties=[("PERF_COUNT", "YES")]))
    with pytest.raises(TrialError, match="use another out="):
        run_trial(other_arm, neutral.path)
    assert neutral.path.read_bytes() == before


def test_a_run_from_another_environment_is_refused_not_averaged(
    neutral: NeutralTrial, tmp_path: Path
) -> None:
    path = tmp_path / "mixed.jsonl"
    lines = read_lines(neutral.path)
    victim = lines[-1]
    library = sorted(victim["environment"]["libraries"])[0]
    victim["environment"]["libraries"][library] = "0" * 32
    write_lines(path, lines)
    with pytest.raises(TrialError, match=r"different environment.*libraries\[") as info:
        run_trial(neutral.plan, path)
    assert library in str(info.value) and f"arm {victim['arm']}" in str(info.value)
    records = [RunRecord.from_json(line) for line in lines[1:]]
    with pytest.raises(TrialError, match="different environment"):
        build_report(neutral.plan, records, path)


def test_arms_on_two_hosts_are_refused(neutral: NeutralTrial, tmp_path: Path) -> None:
    path = tmp_path / "hosts.jsonl"
    lines = read_lines(neutral.path)
    for line in lines[1:]:
        if line["arm"] == "B":
            line["environment"]["host"] = "elsewhere"
    write_lines(path, lines)
    with pytest.raises(TrialError, match="on one machine"):
        run_trial(neutral.plan, path)


def test_a_worker_failure_becomes_its_error_and_leaves_no_file(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "nodevice.jsonl"
    with pytest.raises(DeviceError, match=r"arm [AB] .*'NOPE' is not usable here"):
        run_trial(make_plan(qwen2_dir, device="NOPE"), path)
    assert not path.exists()  # the header waits for the first run


# ------------------------------------------------------------- synthetic reports


def fake_env(host: str = "h") -> dict[str, Any]:
    return {"libraries": {"/ov/libopenvino.so": "1" * 32}, "host": host, "openvino": "x"}


def fake_records(
    plan: TrialPlan, wall: dict[str, list[tuple[float, float]]], blobs: str = "same"
) -> list[RunRecord]:
    """Runs for every planned key; ``wall[label][pair]`` = (A, B) wall seconds."""
    out = []
    for planned in plan.schedule():
        a, b = wall[planned.spec.label][planned.pair]
        seconds = a if planned.arm is Arm.A else b
        blob = "b" * 32 if blobs == "same" or planned.arm is Arm.A else "c" * 32
        if blobs == "mixed" and planned.pair == 1:
            blob = "b" * 32
        out.append(
            RunRecord(
                pair=planned.pair,
                spec_label=planned.spec.label,
                arm=planned.arm,
                position=planned.position,
                wall_s=seconds,
                cpu_s=seconds * 2,
                prepare_s=0.01,
                export_s=0.01,
                blob_xxh3=blob,
                blob_bytes=100,
                peak_rss_bytes=1,
                environment=fake_env(),
                properties_applied={},
            )
        )
    return out


def test_overall_sums_each_pair_over_the_rungs_and_skips_the_warm_up(qwen2_dir: Path) -> None:
    plan = make_plan(qwen2_dir, pairs=3, rungs="32,64")
    wall = {
        "decode@32": [(99.0, 1.0), (1.0, 0.9), (1.0, 0.8), (1.2, 1.0)],
        "decode@64": [(99.0, 1.0), (2.0, 1.8), (2.0, 1.7), (2.1, 2.0)],
    }
    report = build_report(plan, fake_records(plan, wall, blobs="mixed"), Path("r.jsonl"))
    assert report.overall is not None
    assert [p.a_wall_s for p in report.overall.pairs] == pytest.approx([3.0, 3.0, 3.3])
    assert [p.b_wall_s for p in report.overall.pairs] == pytest.approx([2.7, 2.5, 3.0])
    assert report.overall.wall.mean_diff == pytest.approx(-1.1 / 3)
    assert report.overall.wall.b_faster_pairs == 3
    assert report.rungs[0].wall.mean_a == pytest.approx((1.0 + 1.0 + 1.2) / 3)  # no 99
    assert report.rungs[0].verdict is BlobVerdict.MIXED
    assert report.rungs[0].b_blob_variants == 2
    text = "\n".join(format_report(report))
    assert "overall (Σ rungs)" in text and "not deterministic" in text


def test_different_blobs_are_reported_as_different(qwen2_dir: Path) -> None:
    plan = make_plan(qwen2_dir)
    wall = {"decode@32": [(1.0, 1.0), (1.0, 0.9), (1.1, 0.9)]}
    report = build_report(plan, fake_records(plan, wall, blobs="differ"), Path("r.jsonl"))
    assert report.rungs[0].verdict is BlobVerdict.DIFFERENT
    assert report.rungs[0].identical_pairs == 0


def test_zero_variance_is_an_error_not_a_verdict(qwen2_dir: Path) -> None:
    plan = make_plan(qwen2_dir)
    wall = {"decode@32": [(1.0, 1.0), (1.0, 0.9), (1.1, 1.0)]}  # B − A = −0.1 twice
    with pytest.raises(TrialError, match="decode@32 compile wall time: all 2 paired"):
        build_report(plan, fake_records(plan, wall), Path("r.jsonl"))


def test_an_incomplete_trial_has_no_report(qwen2_dir: Path) -> None:
    plan = make_plan(qwen2_dir)
    wall = {"decode@32": [(1.0, 1.0), (1.0, 0.9), (1.1, 0.9)]}
    records = fake_records(plan, wall)[:-1]
    with pytest.raises(TrialError, match="incomplete: 1 run"):
        build_report(plan, records, Path("r.jsonl"))


def test_too_few_pairs_are_refused_before_running(qwen2_dir: Path) -> None:
    with pytest.raises(BadRequestError, match="at least 2 measured pairs"):
        make_plan(qwen2_dir, pairs=1)
