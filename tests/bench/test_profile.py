"""``ovspec profile``: per-op-type time of a rung's step beside the stateful model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import openvino as ov
import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.bench.profile.rung import (
    COMPILE_ORDERS,
    PagedPeer,
    StepProfile,
    _by_type,
    combined,
    profile_rung,
    stateful_floor_ms,
)
from ovspec.cli import cli
from ovspec.compile.devices import profile_for
from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import to_stateless


def test_profile_names_the_op_types_of_both_graphs(qwen2_dir: Path) -> None:
    report = profile_rung(
        ModelDir.open(qwen2_dir), 32, steps=2, properties=EXACT_CPU_PROPERTIES, chunk_tokens=8
    )
    assert (
        report.live_tokens == 31
        and report.rewrites == profile_for("CPU").default_rewrites.canonical
    )
    assert report.graph == "decode@32"  # a later rung's static graph, by default
    assert "FullyConnected" in report.rung.by_type_ms
    assert report.stateful is not None
    assert "ScaledDotProductAttentionWithKVCache" in report.stateful.by_type_ms  # genai's fused op
    # genai's default CPU backend, PagedAttention, is profiled beside it.
    assert report.paged is not None and report.paged.step_ms > 0
    assert any("PagedAttention" in t for t in report.paged.by_type_ms)
    assert report.weights_bytes == qwen2_dir.joinpath("openvino_model.bin").stat().st_size
    assert report.rung.step_ms > 0 and report.weights_read_ms > 0
    assert report.kv_bytes == 31 * 2 * 2 * 2 * 16 * 4  # live tokens x layers x K,V x heads x dims
    # Both compile orders by default, each reported as the rung's step over the peer's.
    assert sorted(report.order_ratios) == ["rung-first", "stateful-first"]
    assert all(ratio > 0 for ratio in report.order_ratios.values())


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each ``compile_model`` call compiled, in order: "rung" (a static graph),
    "stateful" (the dynamic IR) or "paged" (its PagedAttention form)."""
    kinds: list[str] = []
    compile_model = ov.Core.compile_model

    def recording(self: ov.Core, model: ov.Model, *args: Any, **kwargs: Any) -> Any:
        paged = any(p.get_any_name().startswith("key_cache.") for p in model.inputs)
        kinds.append("paged" if paged else "stateful" if model.is_dynamic() else "rung")
        return compile_model(self, model, *args, **kwargs)

    monkeypatch.setattr(ov.Core, "compile_model", recording)
    return kinds


def test_both_orders_compile_each_graph_first_once(qwen2_dir: Path, compiled: list[str]) -> None:
    profile_rung(ModelDir.open(qwen2_dir), 32, steps=1, properties=EXACT_CPU_PROPERTIES)
    assert compiled == ["rung", "stateful", "paged", "stateful", "paged", "rung"]


def test_a_stateless_ir_compiles_its_rung_once(
    qwen2_dir: Path, tmp_path: Path, compiled: list[str]
) -> None:
    folder = tmp_path / "stateless"
    shutil.copytree(qwen2_dir, folder)
    model = ov.Core().read_model(qwen2_dir / "openvino_model.xml")
    to_stateless(model)
    ov.save_model(model, folder / "openvino_model.xml", compress_to_fp16=False)
    report = profile_rung(ModelDir.open(folder), 32, steps=1, properties=EXACT_CPU_PROPERTIES)
    assert report.stateful is None and report.paged is None and report.order_ratios == {}
    assert compiled == ["rung"]  # no peer to order against: one pass


def test_one_compile_order_on_request(qwen2_dir: Path) -> None:
    model = ModelDir.open(qwen2_dir)
    report = profile_rung(
        model, 32, steps=1, properties=EXACT_CPU_PROPERTIES, compile_order="stateful-first"
    )
    assert list(report.order_ratios) == ["stateful-first"]
    assert report.stateful is not None
    ratio = report.rung.step_ms / report.stateful.step_ms
    assert report.order_ratios["stateful-first"] == pytest.approx(ratio)
    with pytest.raises(BadRequestError, match="compile_order"):
        profile_rung(model, 32, steps=1, compile_order="sideways")  # type: ignore[arg-type]


def test_a_step_reads_its_own_time_from_cpu_s_running_mean(qwen2_dir: Path) -> None:
    """The CPU plugin's PERF_COUNT is the mean over the request's calls: read raw, a step
    after a 250-token prompt would carry a share of the prompt's time."""
    assert profile_for("CPU").perf_count_running_mean
    props = {**EXACT_CPU_PROPERTIES, "PERF_COUNT": "YES"}
    peer = PagedPeer(ModelDir.open(qwen2_dir), "CPU", props, ov.Core())
    stepper = peer.stepper(250, 256)
    assert stepper.calls == 1 and stepper.running_mean  # the prompt, in one call
    wall_ms, own = stepper.step()
    mean_of_both = sum(_by_type(stepper.request).values())  # (prompt + step) / 2
    assert sum(own.values()) <= 1.5 * wall_ms + 0.05
    assert mean_of_both > 2 * sum(own.values())
    _, again = stepper.step()
    assert sum(again.values()) <= 2 * sum(own.values()) + 0.05  # no prompt share later


def test_compile_orders_combine_by_geometric_mean() -> None:
    first = StepProfile(40.0, {"FullyConnected": 30.0, "Subgraph": 2.0})
    second = StepProfile(10.0, {"FullyConnected": 8.0, "MatMul": 1.0})
    both = combined([first, second])
    assert both.step_ms == pytest.approx(20.0)  # sqrt(40 x 10), not the mean 25
    assert both.by_type_ms == pytest.approx(
        {"FullyConnected": 19.0, "Subgraph": 1.0, "MatMul": 0.5}
    )
    assert list(both.by_type_ms) == ["FullyConnected", "Subgraph", "MatMul"]  # largest first


def test_stateful_floor_per_live_length(qwen2_dir: Path) -> None:
    floor = stateful_floor_ms(ModelDir.open(qwen2_dir), [0, 31], "CPU", EXACT_CPU_PROPERTIES, 2)
    assert sorted(floor) == [0, 31] and all(ms > 0 for ms in floor.values())


def test_the_command_offers_the_library_s_compile_orders() -> None:
    option = next(p for p in cli.commands["profile"].params if p.name == "compile_order")
    assert tuple(option.type.choices) == COMPILE_ORDERS  # type: ignore[attr-defined]


def test_profile_command(qwen2_dir: Path, tmp_path: Path) -> None:
    args = ["profile", str(qwen2_dir), "--rung", "32", "--steps", "1", "--cache-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["capacity_tokens"] == 32 and doc["floor"]["stateful_step_ms"] > 0
    assert doc["floor"]["paged_step_ms"] > 0 and doc["paged"]["step_ms"] > 0
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "FullyConnected" in text.stdout and "floor:" in text.stdout
    assert "paged ms" in text.stdout and "ATTENTION_BACKEND=SDPA" in text.stdout
    assert "both compile orders" in text.stdout and "rung-first" in text.stdout
    one = CliRunner().invoke(cli, [*args, "--compile-order", "rung-first", "--json"])
    assert one.exit_code == 0 and list(json.loads(one.stdout)["order_ratios"]) == ["rung-first"]
    bad = CliRunner().invoke(cli, [*args, "--live", "32"])
    assert bad.exit_code == 2 and "below the rung 32" in bad.output
