"""ovspec bench on a tiny model: five protocols, fresh processes, figures that add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401
from ovspec.bench.protocols.report import _gain_text, environment, render_text, to_json, write_plots
from ovspec.bench.protocols.runner import (
    BenchConfig,
    band_comparison,
    boundary_agreement,
    paired_vs_control,
    run_bench,
)
from ovspec.bench.protocols.setups import Protocol
from ovspec.cli import cli
from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    config = BenchConfig(
        model=ModelDir.open(Path(__file__).parents[1] / "data" / "qwen2"),
        ladder=Ladder((64, 128)),  # page-aligned, so I3 (remap) can map it
        prompt_tokens=8,
        new_tokens=70,
        repetitions=1,
        variants=("cold",),
        device="CPU",
        properties=dict(EXACT_CPU_PROPERTIES),
        prefill_chunk_tokens=8,
        seed=1,
        work_dir=tmp_path_factory.mktemp("bench"),
    )
    return run_bench(config)


def test_every_protocol_ran_once(result) -> None:  # type: ignore[no-untyped-def]
    assert sorted(r.figures.protocol for r in result.runs) == ["B0", "B1", "I1", "I2", "I3"]
    for run in result.runs:
        f = run.figures
        assert 0 < f.foreground_s <= f.time_to_first_token_s <= f.critical_path_s
        assert f.decode_tokens == 70  # teacher forcing feeds every forced token
        assert f.peak_rss_bytes > 0 and f.decode_s > 0


def test_boundaries_and_migrations(result) -> None:  # type: ignore[no-untyped-def]
    fig = {r.figures.protocol: r.figures for r in result.runs}
    assert fig["B0"].boundaries == ()  # one rung at the top capacity
    (b1,) = fig["B1"].boundaries
    # B1 re-strides its live KV inside the one top-rung buffer: no allocation.
    assert b1.allocated_bytes == 0 and b1.copied_bytes == 64 * fig["B1"].kv_bytes_per_token
    (i1,) = fig["I1"].boundaries
    assert (i1.from_capacity_tokens, i1.to_capacity_tokens, i1.at_live_tokens) == (64, 128, 64)
    assert i1.copied_bytes == 64 * fig["I1"].kv_bytes_per_token
    assert i1.peak_reserved_bytes == (64 + 128) * fig["I1"].kv_bytes_per_token
    (i2,) = fig["I2"].boundaries
    assert i2.loaded_in_background and not i1.loaded_in_background
    assert fig["I1"].reserved_kv_time_weighted_bytes < fig["B0"].reserved_kv_time_weighted_bytes
    assert fig["B0"].peak_kv_bytes == 128 * fig["B0"].kv_bytes_per_token


def test_remap_moves_pages_and_its_physical_kv_follows_the_tokens(result) -> None:  # type: ignore[no-untyped-def]
    fig = {r.figures.protocol: r.figures for r in result.runs}
    i3, i2 = fig["I3"], fig["I2"]
    assert i3.kv_layout == "remap" and i2.kv_layout == "copy-and-grow"
    (boundary,) = i3.boundaries
    assert boundary.copied_bytes == 0 and boundary.moved_bytes > 0
    # 8 blocks (4 tensors x 2 heads) of 64-byte tokens: a page per 64 tokens per block.
    end_pages = 8 * -(-78 // 64)
    assert i3.peak_physical_kv_bytes == end_pages * 4096
    (copying,) = i2.boundaries
    assert copying.peak_physical_bytes == 2 * copying.copied_bytes  # the transient double
    for f in (i3, i2):
        assert f.physical_kv_token_weighted_bytes is not None
        assert f.physical_kv_time_weighted_bytes is not None
        assert 0 < f.physical_kv_token_weighted_bytes <= f.reserved_kv_token_weighted_bytes


def test_boundary_logits_agree_with_the_control(result) -> None:  # type: ignore[no-untyped-def]
    for protocol in (Protocol.B0, Protocol.B1, Protocol.I2, Protocol.I3):
        agreement = boundary_agreement(result, "cold", protocol)
        assert agreement.compared == 4  # live positions 63, 64, 65, 66
        assert agreement.top1_equal == agreement.compared
        assert agreement.min_cosine >= 0.99999


def test_one_repetition_gives_no_paired_verdict(result) -> None:  # type: ignore[no-untyped-def]
    summary = paired_vs_control(result, "cold", Protocol.I2, "foreground_s")
    assert isinstance(summary, str) and summary.startswith("n/a")


def test_report_text_json_and_plots(result, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = environment()
    text = "\n".join(render_text(result, env))
    for needle in (
        "fg compile s",
        "critical s",
        "deadlines",
        "KV avg MiB",
        "RSS MiB",
        "decode tokens/s per context band",
        "memcpy",
        "boundary logits vs I1",
        "copy-and-grow time-weighted KV",
        "KV memory, MiB",
        "phys token-w",
        "pages moved, no copy",
    ):
        assert needle in text
    # One repetition: said once, not as a line of n/a per figure.
    assert text.count("paired statistics need at least 2 repetitions") == 1
    assert "n/a" not in text
    document = json.loads(json.dumps(to_json(result, env)))
    assert set(document["variants"]["cold"]) == {"B0", "B1", "I1", "I2", "I3"}
    assert document["variants"]["cold"]["I3"]["kv_layout"] == "remap"
    assert document["variants"]["cold"]["I2"]["vs_control"]["boundary_agreement"]["compared"] == 4
    assert band_comparison(result, "cold", Protocol.I1)
    written = write_plots(result, tmp_path)
    assert {p.name for p in written} == {"timeline-cold.png", "kv-cold.png", "kv-time-cold.png"}
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_refuses_a_budget_over_the_top_rung(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="exceed the top rung 64"):
        BenchConfig(
            model=ModelDir.open(Path(__file__).parents[1] / "data" / "qwen2"),
            ladder=Ladder((32, 64)),
            prompt_tokens=8,
            new_tokens=60,
            repetitions=1,
            variants=("cold",),
            device="CPU",
            properties={},
            prefill_chunk_tokens=8,
            seed=0,
            work_dir=tmp_path,
        )


def test_cli_help_and_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["bench", "--help"]).exit_code == 0
    result = runner.invoke(
        cli,
        [
            "bench",
            str(Path(__file__).parents[1] / "data" / "qwen2"),
            "--ladder",
            "32,64",
            "--new-tokens",
            "100",
            "--out-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "exceed the top rung" in result.stderr
    for extra, message in (
        (["--protocols", "B0,I9"], "--protocols takes a list of B0, B1, I1, I2, I3"),
        (["--prompt-tokens", "8", "--new-tokens", "20"], "cannot map rung 32"),
        (["--prompt-tokens", "8", "--new-tokens", "20"], "or --protocols B0,B1,I1,I2"),
    ):
        model = str(Path(__file__).parents[1] / "data" / "qwen2")
        args = ["bench", model, "--ladder", "32,64", *extra, "--out-dir", str(tmp_path)]
        refused = runner.invoke(cli, args)
        assert refused.exit_code == 2, refused.output
        assert refused.stderr.count("\n") == 1 and message in refused.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    ("predicted", "fraction", "text"),
    [
        (1.02, 0.5, ""),  # a noise-level prediction gets no percentage
        (1.9, -3.79, " (slower than B0, where a gain was predicted)"),
        (1.9, 0.8, " (80% of the predicted gain)"),
    ],
)
def test_gain_text(predicted: float, fraction: float, text: str) -> None:
    assert _gain_text(predicted, fraction) == text
