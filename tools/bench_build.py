#!/usr/bin/env python3
"""Build benchmark: what a ladder of specializations costs to build, key, import and store.

Measures, in one run and side by side for weightless and full blobs: per specialization
compile/export/import seconds and blob bytes; key derivation cold and memoized; cold
(empty store) vs warm (all hits) builds of the whole ladder; store bytes of the ladder
against one full blob and the model's weights. Prints figures; asserts nothing on time.

    python tools/bench_build.py --repeats 3            # ~0.5B-shaped built-in model
    python tools/bench_build.py --repeats 3 --write docs/benchmarks   # the committed page
    python tools/bench_build.py --model /path/to/ir --json
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.build.page import PAGE
from ovspec.bench.build.report import format_report
from ovspec.bench.build.runner import Settings, run_benchmark
from ovspec.bench.common.commandline import model_options, progress_printer
from ovspec.bench.common.pages import write_page
from ovspec.cli import tool_errors
from ovspec.cli.options import chunk_option, device_options, ladder_option, phases_option
from ovspec.ladder import Ladder

# --------------------------------------------------------------------------- command line


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@model_options()
@ladder_option
@phases_option
@chunk_option
@device_options
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Cold/warm ladder builds per blob mode (each in a fresh store).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Specializations compiled at once in a cold build (as `ovspec build --jobs`); "
    "above 1 the per-specialization compile seconds include sharing the cores.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(tempfile.gettempdir()),
    show_default=True,
    help="Where the scratch stores go (deleted afterwards); a full ladder needs ~rungs x "
    "phases x the .bin size.",
)
@click.option(
    "--cli/--no-cli",
    default=True,
    show_default=True,
    help="Also time a warm `ovspec build` in a new process.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@click.option(
    "--write",
    "pages_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also save results/build.json under this folder and render build.md from it "
    "(docs/benchmarks for the committed page).",
)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON document to this file (the table still goes to stdout).",
)
def main(
    model_reference: str,
    models_dir: Path,
    ladder: Ladder,
    phases: str,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    repeats: int,
    jobs: int,
    work_dir: Path,
    cli: bool,
    as_json: bool,
    pages_dir: Path | None,
    json_out: Path | None,
) -> None:
    """Benchmark building a ladder of specializations: compile, export, import, keys,
    cold vs warm builds and store bytes, weightless vs full blobs. Progress goes to
    stderr, figures to stdout."""
    settings = Settings(
        model_reference=model_reference,
        models_dir=models_dir,
        ladder=ladder,
        phases=phases,
        chunk_tokens=chunk_tokens,
        device=device,
        properties=dict(config),
        repeats=repeats,
        jobs=jobs,
        work_dir=work_dir,
        cli=cli,
    )
    command = shlex.join(["python", "tools/bench_build.py", *sys.argv[1:]])
    started = time.perf_counter()
    say = progress_printer(started)

    with tool_errors("bench_build: error"):
        report = run_benchmark(settings, command, say)
    document = json.dumps(report.to_json(), indent=2)
    if pages_dir is not None:
        write_page(pages_dir, PAGE, report.to_json())
    if json_out is not None:
        json_out.write_text(document + "\n", encoding="utf-8")
    if as_json:
        click.echo(document)
    else:
        click.echo(format_report(report))


if __name__ == "__main__":
    main()
