#!/usr/bin/env python3
"""Remote tier benchmark: a fresh store's spawn -> first token with a warm remote (a second
machine, simulated on this host) vs a cold compile vs a warm local store, as paired ratios
in one run, and the bytes a ladder moves. Starts its own SeaweedFS on 127.0.0.1; writes
docs/benchmarks/results/remote.json and renders docs/benchmarks/remote.md from it.

    python tools/bench_remote.py                         # the 0.5B-shaped built-in model
    python tools/bench_remote.py --model builtin:tiny --ladder 32,64 --repeats 1 --pages-dir /tmp/p
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.commandline import model_options, progress_printer
from ovspec.bench.common.pages import write_page
from ovspec.bench.remote.runner import PAGE, Settings, run_benchmark
from ovspec.cli import tool_errors
from ovspec.cli.options import chunk_option, ladder_option, phases_option
from ovspec.ladder import Ladder

PAGES_DIR = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@model_options()
@ladder_option
@phases_option
@chunk_option
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Prompt length of each first-token run.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="Repeats of the three arms (rotated order; a multiple of 3 balances positions).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(tempfile.gettempdir()),
    show_default=True,
    help="Where the stores and the server's data go (deleted afterwards).",
)
@click.option(
    "--pages-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES_DIR,
    show_default=True,
    help="Where the results file and the page are written.",
)
def main(
    model_reference: str,
    models_dir: Path,
    ladder: Ladder,
    phases: str,
    chunk_tokens: int,
    prompt_tokens: int,
    repeats: int,
    work_dir: Path,
    pages_dir: Path,
) -> None:
    """Time a fresh process to its first token: cold compile, warm remote, warm local."""
    command = shlex.join(["python", "tools/bench_remote.py", *sys.argv[1:]])
    started = time.perf_counter()
    say = progress_printer(started)

    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="ovspec-bench-remote-", dir=work_dir))
    except OSError as exc:
        raise click.BadParameter(f"{work_dir}: {exc.strerror}", param_hint="--work-dir") from exc
    with tool_errors("bench_remote: error"):
        try:
            settings = Settings(
                model_reference=model_reference,
                models_dir=models_dir,
                ladder=ladder,
                phases=phases,
                chunk_tokens=chunk_tokens,
                prompt_tokens=prompt_tokens,
                repeats=repeats,
                work_dir=scratch,
            )
            results = run_benchmark(settings, say)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    results["command"] = command
    results["wall_s"] = round(time.perf_counter() - started, 1)
    page = write_page(pages_dir, PAGE, results)
    click.echo(page.read_text(encoding="utf-8"))
    say(f"wrote {page}")


if __name__ == "__main__":
    main()
