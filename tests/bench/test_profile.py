"""``ovspec profile``: per-op-type time of a rung's step beside the stateful model."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.bench.profile import profile_rung, stateful_floor_ms
from ovspec.cli import cli
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import RewriteSet


def test_profile_names_the_op_types_of_both_graphs(qwen2_dir: Path) -> None:
    report = profile_rung(
        ModelDir.open(qwen2_dir), 32, steps=2, properties=EXACT_CPU_PROPERTIES, chunk_tokens=8
    )
    assert report.live_tokens == 31 and report.rewrites == RewriteSet.for_device("CPU").canonical
    assert report.graph == "decode@32"  # a later rung's static graph, by default
    assert "FullyConnected" in report.rung.by_type_ms
    assert report.stateful is not None
    assert "ScaledDotProductAttentionWithKVCache" in report.stateful.by_type_ms  # genai's fused op
    assert report.weights_bytes == qwen2_dir.joinpath("openvino_model.bin").stat().st_size
    assert report.rung.step_ms > 0 and report.weights_read_ms > 0
    assert report.kv_bytes == 31 * 2 * 2 * 2 * 16 * 4  # live tokens x layers x K,V x heads x dims


def test_stateful_floor_per_live_length(qwen2_dir: Path) -> None:
    floor = stateful_floor_ms(ModelDir.open(qwen2_dir), [0, 31], "CPU", EXACT_CPU_PROPERTIES, 2)
    assert sorted(floor) == [0, 31] and all(ms > 0 for ms in floor.values())


def test_profile_command(qwen2_dir: Path, tmp_path: Path) -> None:
    args = ["profile", str(qwen2_dir), "--rung", "32", "--steps", "1", "--cache-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["capacity_tokens"] == 32 and doc["floor"]["stateful_step_ms"] > 0
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "FullyConnected" in text.stdout and "floor:" in text.stdout
    bad = CliRunner().invoke(cli, [*args, "--live", "32"])
    assert bad.exit_code == 2 and "below the rung 32" in bad.output
