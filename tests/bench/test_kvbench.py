"""The KV-layout benchmark on the built-in tiny model: both parts run, the page adds up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ovspec.bench.kv.boundaries import (
    COPY,
    DECODE_ARMS,
    MEMCPY,
    PREFAULT,
    REMAP,
    run_boundaries,
    summarize_boundaries,
)
from ovspec.bench.kv.decode import DecodeConfig, compare_bands, run_decode
from ovspec.bench.kv.page import environment, render, results_document, write_plot
from ovspec.errors import BadRequestError, LadderError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import prepare, read_ir
from ovspec.ladder import Ladder
from ovspec.runtime import vmem

pytestmark = pytest.mark.skipif(
    vmem.unsupported_reason() is not None, reason=f"no page mapping: {vmem.unsupported_reason()}"
)
TOOL = Path(__file__).parents[2] / "tools" / "bench_kv.py"


def test_boundaries_copy_nothing_with_remap(tiny_dir: Path) -> None:
    roles = prepare(read_ir(tiny_dir / "openvino_model.xml")).roles
    samples = run_boundaries(roles, Ladder((64, 128, 256, 512)), 2, lambda _: None)
    rows = summarize_boundaries(samples)
    assert {(r["from"], r["arm"]) for r in rows} == {
        (low, arm) for low in (64, 128, 256) for arm in (REMAP, COPY, PREFAULT, MEMCPY)
    }
    for r in rows:
        assert r["n"] == 2
        live = r["live_bytes"]
        if r["arm"] == REMAP:
            assert r["copied_bytes"] == 0 and r["moved_bytes"] == live // 2  # block 1 of 2
            assert r["peak_physical_bytes"] == live  # never old and new at once
        elif r["arm"] in (COPY, PREFAULT):
            assert r["copied_bytes"] == live and r["moved_bytes"] == 0
            assert r["peak_physical_bytes"] == 2 * live
        else:
            assert r["copied_bytes"] == live and r["copy_bytes_per_s"] > 0
    with pytest.raises(LadderError, match="cannot map rung 32"):
        run_boundaries(roles, Ladder((32, 64)), 1, lambda _: None)


def test_lockstep_decode_and_the_page(tiny_dir: Path, tmp_path: Path) -> None:
    config = DecodeConfig(
        model=tiny_dir,
        ladder=Ladder((64, 128, 256)),
        prompt_tokens=16,
        prefill_chunk_tokens=16,
        properties=dict(EXACT_CPU_PROPERTIES),
        store=tmp_path / "store",
        seed=1,
        prefault_lead_tokens=8,
        passes=2,
    )
    run = run_decode(config, lambda _: None)
    assert set(run.traces) == set(DECODE_ARMS)
    # The second pass: copy-and-grow against remap alone, pooled into remap's bands only.
    assert [set(t) for t in run.speed_traces] == [{COPY, REMAP}]
    assert [b["copied_bytes"] for b in run.speed_traces[0][REMAP].boundaries] == [0, 0]
    assert [r.steps for r in compare_bands(run, REMAP)] == [96, 128, 256]
    assert [r.steps for r in compare_bands(run, PREFAULT)] == [48, 64, 128]
    for arm, agreement in run.agreement.items():
        assert agreement["steps"] == 240, arm
        assert agreement["top1_equal"] == 240 and agreement["min_cosine"] >= 0.9999999
        assert agreement["boundary_steps"] == 8  # live 63..66 and 127..130
    remap, copy = run.traces[REMAP], run.traces[COPY]
    assert [b["copied_bytes"] for b in remap.boundaries] == [0, 0]
    assert [b["at_live_tokens"] for b in copy.boundaries] == [64, 128]
    assert all(b["peak_physical_bytes"] == 2 * b["copied_bytes"] for b in copy.boundaries)
    figures = remap.figures(run.clock)
    assert figures["physical_peak_bytes"] <= figures["reserved_peak_bytes"]
    assert len(remap.samples) == 241 and len(remap.durations) == 240

    roles = prepare(read_ir(tiny_dir / "openvino_model.xml")).roles
    samples = run_boundaries(roles, Ladder((64, 128, 256, 512, 1024)), 1, lambda _: None)
    plot = write_plot(run, tmp_path / "kv.png")
    document = results_document(
        "python tools/bench_kv.py --model builtin:tiny",
        environment(),
        ("1.00 / 1.00 / 1.00", "1.00 / 1.00 / 1.00"),
        "builtin:tiny",
        samples,
        "64,128,256,512,1024",
        1,
        run,
        plot.name,
        12.0,
    )
    page = render(document)
    assert render(json.loads(json.dumps(document))) == page  # the saved JSON is all it needs
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for needle in (
        "## 1. One boundary",
        "## 2. KV memory over a decode run",
        "## 3. Decode speed per band",
        "## 4. Logits",
        "| bytes copied at a boundary: 0 (over 4 boundaries, live KV 8x apart) | 0 bytes | "
        "**met** |",
        "![virtual and physical KV over time](kv.png)",
    ):
        assert needle in page
    assert all(r["copied_bytes"] == 0 for r in document["part1"]["rows"] if r["arm"] == REMAP)
    quiet = document["part2"]["speed_pass_migration_s"]
    assert [len(one_pass) for one_pass in quiet[REMAP]] == [2]  # one speed pass, 2 boundaries
    assert "over 2 boundaries: copy-and-grow median" in page


def test_config_and_tool_refuse_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="--prompt-tokens"):
        DecodeConfig(tmp_path, Ladder((64,)), 64, 16, {}, tmp_path, 0)
    with pytest.raises(BadRequestError, match="include copy-and-grow and remap"):
        DecodeConfig(tmp_path, Ladder((64, 128)), 8, 16, {}, tmp_path, 0, arms=(REMAP,))
    done = subprocess.run(
        [sys.executable, str(TOOL), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "--boundary-ladder" in done.stdout
    bad = subprocess.run(
        [sys.executable, str(TOOL), "--model", "builtin:tiny", "--models-dir", str(tmp_path),
         "--boundary-ladder", "32,64", "--out", str(tmp_path / "kv.md")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("bench_kv: error: the remap KV layout")
    assert not (tmp_path / "kv.md").exists()
