#!/usr/bin/env python3
"""The noise floor: fresh processes one after another, each stepping the same static
decode graph with plain OpenVINO on one pinned core (no ovspec code in the loop) beside a
compute-bound numpy control, every step's time kept. Prints the spread between and within
processes and what an A/A comparison of such processes resolves, and writes
docs/benchmarks/noise-floor.md with its raw samples (results/noise-floor.json); about
2 min with the defaults:

    python tools/noise_floor.py
    python tools/noise_floor.py --model builtin:tiny --processes 4 --steps 300 --out /tmp/n
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import tempfile
import time
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.common.pages import write_page_with
from ovspec.bench.noise.page import PAGE, aa_pairs, render
from ovspec.bench.noise.probe import ProbeRequest
from ovspec.bench.noise.runner import results_document, run_processes
from ovspec.cli import tool_errors
from ovspec.compile.split import CoreSplit, usable_cores
from ovspec.errors import BadRequestError, TrialError
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.stats.paired import PairedSummary

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:small", show_default=True)
@click.option("--capacity", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option(
    "--processes",
    type=click.IntRange(min=4),
    default=12,
    show_default=True,
    help="Fresh processes, paired in turn for the A/A interval (2 pairs at least).",
)
@click.option("--steps", type=click.IntRange(min=1), default=1500, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(min=0), default=50, show_default=True)
@click.option("--control-steps", type=click.IntRange(min=1), default=3000, show_default=True)
@click.option(
    "--core",
    type=click.IntRange(min=0),
    default=None,
    help="The core every process runs on [default: the split's device core, as the sweep].",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where noise-floor.md and results/noise-floor.json go.",
)
def main(
    model: str,
    capacity: int,
    processes: int,
    steps: int,
    warmup_steps: int,
    control_steps: int,
    core: int | None,
    out: Path,
) -> None:
    """Measure how far one decode step's time moves between fresh processes."""
    with tool_errors("noise_floor"), tempfile.TemporaryDirectory(prefix="ovspec-noise-") as tmp:
        if core is None:
            split = CoreSplit.default()
            if split is None:
                raise BadRequestError("one usable core: give --core")
            core = split.device[0]
        if core not in usable_cores():
            raise BadRequestError(
                f"--core {core} is not one of this process's cores {usable_cores()}"
            )
        load_start = load_average()
        began = time.perf_counter()
        model_dir = resolve_model(model, Path(tmp) / "models")
        request = ProbeRequest(
            model_dir=str(model_dir.root),
            capacity_tokens=capacity,
            warmup_steps=warmup_steps,
            steps=steps,
            control_steps=control_steps,
            core=core,
            properties={**EXACT_CPU_PROPERTIES, "INFERENCE_NUM_THREADS": "1"},
        )
        runs = run_processes(
            request,
            processes,
            Path(tmp) / "runs",
            lambda i, n: click.echo(f"noise_floor: process {i + 1}/{n}", err=True),
        )
        document = results_document(
            request,
            runs,
            model=model,
            command=shlex.join(["python", "tools/noise_floor.py", *sys.argv[1:]]),
            environment=dataclasses.asdict(environment(load_start)),
            wall_s=time.perf_counter() - began,
        )
        page = write_page_with(out, PAGE, document, render)
    for name, key, scale, unit in (
        ("decode step", "step_s", 1e3, "ms"),
        ("control", "control_s", 1e6, "us"),
    ):
        means = [scale * sum(r[key]) / len(r[key]) for r in runs]
        try:
            spread = f"; A/A {_interval(aa_pairs(means))}"
        except TrialError as exc:
            spread = f"; no A/A interval: {exc}"
        click.echo(f"{name}: process means {min(means):.3f}-{max(means):.3f} {unit}{spread}")
    click.echo(f"wrote {page}")


def _interval(summary: PairedSummary) -> str:
    low, high = (100 * x / summary.mean_a for x in (summary.t_test.ci_low, summary.t_test.ci_high))
    return f"[{low:+.1f}%, {high:+.1f}%]"


if __name__ == "__main__":
    main()
