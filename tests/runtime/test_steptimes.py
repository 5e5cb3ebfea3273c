"""The store's record of decode step and import times: a round trip, the median of the
last few runs, a damaged file read as no history, and a second ``auto`` run planning
from what the first recorded (a real tiny model and store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ovspec
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.autorun import AutoLoader
from ovspec.runtime.decoding import decode
from ovspec.runtime.loader import EventKind
from ovspec.store import Store
from ovspec.store.steptimes import KEPT_RUNS, read_step_times, record_step_times


def test_records_the_median_of_the_last_runs(tmp_path: Path) -> None:
    for decode_s in (0.5, 0.001, 0.002, 0.003, 0.004, 0.005):
        record_step_times(tmp_path, {"ab": ("decode@64", decode_s, 0.1)})
    (times,) = read_step_times(tmp_path).values()
    assert times.runs == KEPT_RUNS  # the 0.5 s hiccup fell out
    assert times.decode_s_per_token == pytest.approx(0.003)
    assert times.import_s == pytest.approx(0.1) and times.label == "decode@64"


def test_a_damaged_record_is_no_history(tmp_path: Path) -> None:
    (tmp_path / "step-times.json").write_text("{not json")
    assert read_step_times(tmp_path) == {}
    record_step_times(tmp_path, {"ab": ("decode@64", 0.002, 0.0), "cd": ("x", float("nan"), 0)})
    assert list(read_step_times(tmp_path)) == ["ab"]  # rewritten whole; no NaN kept


def test_a_link_or_fifo_in_its_place_is_not_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"ab": {"label": "x", "decode_s_per_token": [0.5]}}')
    (tmp_path / "step-times.json").symlink_to(target)
    assert read_step_times(tmp_path) == {}  # a link is not followed
    (tmp_path / "step-times.json").unlink()
    os.mkfifo(tmp_path / "step-times.json")
    assert read_step_times(tmp_path) == {}  # returns at once: a FIFO is never opened blocking


def run_auto(model: Path, store: Store) -> AutoLoader:
    with ovspec.open(
        model,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        policy="auto",
        prefill_chunk_tokens=8,
        load_mode="import",
    ) as loader:
        assert isinstance(loader, AutoLoader)
        decode(loader, list(range(3, 19)), max_new_tokens=100)
    return loader


def test_the_second_auto_run_plans_from_the_first_runs_record(tiny_dir: Path, store: Store) -> None:
    first = run_auto(tiny_dir, store)
    assert first.decision is None  # nothing recorded yet: one ahead
    recorded = {t.label for t in read_step_times(store.root).values()}
    assert recorded == {"decode@32", "decode@64", "decode@128"}
    second = run_auto(tiny_dir, store)
    assert second.decision is not None
    planned = next(e for e in second.events if e.kind is EventKind.PLANNED)
    assert not planned.note.startswith("one ahead:")


def test_plan_reads_the_recorded_step_times(tiny_dir: Path, store: Store) -> None:
    from ovspec.ladder import Ladder
    from ovspec.runtime.planner import PlanRequest, make_plan

    request = PlanRequest(
        str(tiny_dir),
        Ladder((32, 64, 128)),
        prompt_tokens=16,
        new_tokens=100,
        properties=EXACT_CPU_PROPERTIES,
        chunk_tokens=8,
    )
    run_auto(tiny_dir, store)
    recorded = {t.label: t.decode_s_per_token for t in read_step_times(store.root).values()}
    report = make_plan(request, store)
    assert report.sources["decode"].startswith("store history: decode seconds per token")
    assert report.costs.decode_s_per_token[64] == pytest.approx(recorded["decode@64"])
    imports = {t.label: t.import_s for t in read_step_times(store.root).values()}
    for rung in (32, 64, 128):  # a rung is ready after its build and its recorded import
        built = report.details[rung]["history"]
        assert isinstance(built, dict) and built["recorded_import_s"] == imports[f"decode@{rung}"]
        expected = built["compile_s"] + built["export_s"] + imports[f"decode@{rung}"]
        assert report.costs.compile_s[rung] == pytest.approx(expected)
    assert "plus the import past runs recorded" in report.sources["compile"]
    assert report.auto is not None
