"""The ab-compile page is computed from the trials' raw run records: the blob gate and
the paired figures follow the records, and the tool writes a page its results render."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ovspec.bench.common import pages

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_abcompile.py"


def _document() -> dict[str, object]:
    data: dict[str, object] = json.loads(
        pages.results_path(DOCS, "ab-compile").read_text(encoding="utf-8")
    )
    return data


def _measured(trial: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in trial["runs"] if not r["warmup"]]


def test_the_gate_follows_the_recorded_blob_hashes() -> None:
    document = _document()
    trial = document["trials"][0]  # type: ignore[index]
    pairs = len({r["pair"] for r in _measured(trial)})
    text = pages.renderer("ab-compile")(document)
    for rung in sorted({r["specialization"] for r in _measured(trial)}):
        # The neutral control: every measured pair byte-identical, one blob per arm.
        assert f"| {rung} | {pairs}/{pairs} | 1 | 1 | identical |" in text
    changed = copy.deepcopy(document)
    measured_b = [r for r in _measured(changed["trials"][0]) if r["arm"] == "B"]  # type: ignore[index]
    measured_b[0]["blob_xxh3"] = "0" * 32
    text = pages.renderer("ab-compile")(changed)
    assert "| mixed |" in text


def test_a_compile_time_difference_is_read_from_its_interval() -> None:
    document = copy.deepcopy(_document())
    trial = document["trials"][0]  # type: ignore[index]
    # Three measured pairs (and the warm-up): the sign-flip p cannot go below 0.25.
    kept = sorted({r["pair"] for r in _measured(trial)})[:3]
    trial["runs"] = [r for r in trial["runs"] if r["warmup"] or r["pair"] in kept]
    for k, run in enumerate(trial["runs"]):
        run["wall_s"] = 1.0 + (0.5 + 0.01 * (k % 3) if run["arm"] == "B" else 0.0)
    text = pages.renderer("ab-compile")(document)
    summary = next(x for x in text.splitlines() if x.startswith("- Blob-neutral control"))
    assert "B slower: the whole 95% interval is above 0" in summary
    assert "too few to lean on" in summary


def test_the_tool_writes_a_page_from_its_trials(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--model", "builtin:tiny", "--rungs", "32", "--pairs", "2",
         "--devices", "CPU", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-800:]
    written = json.loads(out.stdout)
    results = json.loads(Path(written["results"]).read_text(encoding="utf-8"))
    assert [t["header"]["kind"] for t in results["trials"]] == ["header", "header"]
    for trial in results["trials"]:
        assert len(trial["runs"]) == (2 + 1) * 2  # pairs plus the warm-up, two arms
    text = Path(written["page"]).read_text(encoding="utf-8")
    assert text == pages.render_saved(tmp_path, "ab-compile")
    assert "| decode@32 | 2/2 | 1 | 1 | identical |" in text
    assert "| decode@32 | 0/2 | 1 | 1 | different |" in text


def test_the_tool_writes_an_npu_section_from_its_npuw_trials(tmp_path: Path) -> None:
    """The NPU plugin's trials (NPUW on CPU subdevices): each arm set as asked, on NPU, and
    both option pairs change the blob (the gate says so in every pair)."""
    out = subprocess.run(
        [sys.executable, str(TOOL), "--model", "builtin:tiny", "--rungs", "32", "--pairs", "2",
         "--devices", "NPU", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-800:]
    written = json.loads(out.stdout)
    results = json.loads(Path(written["results"]).read_text(encoding="utf-8"))
    headers = [t["header"] for t in results["trials"]]
    assert [h["device"] for h in headers] == ["NPU", "NPU"]
    assert headers[0]["arms"]["B"]["config"]["NPUW_FOLD"] == "YES"
    assert headers[1]["arms"]["B"]["config"]["NPUW_ONLINE_PIPELINE"] == "NONE"
    text = Path(written["page"]).read_text(encoding="utf-8")
    assert text == pages.render_saved(tmp_path, "ab-compile")
    # Unfolded blobs are one per arm; a folded one may vary across processes (the
    # gate counts its variants): either way no pair's blobs are the same.
    assert "| decode@32 | 0/2 | 1 | 1 | different |" in text  # the partitioning trial
    assert text.count("| decode@32 | 0/2 | 1 |") == 2


def test_the_tool_refuses_an_unknown_device_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(TOOL), "--devices", "GPU", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "bench_abcompile: --devices 'GPU': name one or more of CPU, NPU, comma-separated"
    ]
