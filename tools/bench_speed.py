#!/usr/bin/env python3
"""Speed benchmark: ovspec against openvino-genai's LLMPipeline, side by side in one run.

Decode ms/token per context band with the ratio to genai at the same live context,
identical greedy tokens, spawn -> first token (warm and cold store), peak RSS and PSS,
and the eager protocol's memory; a fresh process per run, arms interleaved, medians.
Regenerates docs/benchmarks/speed.md and docs/benchmarks/results/speed.json:

    python tools/bench_speed.py                      # the page's full run (~25 min quiet)
    python tools/bench_speed.py --new-tokens 200 --repetitions 1 --out /tmp/speed  # a try
    python tools/bench_speed.py --arms genai,ovspec-warm --against /tmp/base --out /tmp/ab
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.bench.speed.runner import (
    ARMS,
    DEFAULT_ARMS,
    DEFAULT_LADDER,
    PAGE,
    SpeedConfig,
    run_speed,
)
from ovspec.cli import tool_errors
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:qwen2.5-0.5b", show_default=True)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "speed",
    show_default=True,
    help="Built-in models and the warm stores, kept between runs.",
)
@click.option("--ladder", default=DEFAULT_LADDER, show_default=True)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=2), default=1000, show_default=True)
@click.option("--repetitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--arms",
    default=",".join(DEFAULT_ARMS),
    show_default=True,
    help=f"Comma list of {', '.join(ARMS)}.",
)
@click.option(
    "--against",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A checkout of ovspec (e.g. `git worktree add /tmp/base HEAD~1`) whose ovspec arms "
    "run beside this one's in every repetition, labelled ARM@base.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where speed.md and results/speed.json go.",
)
def main(
    model: str,
    work_dir: Path,
    ladder: str,
    prompt_tokens: int,
    new_tokens: int,
    repetitions: int,
    arms: str,
    against: Path | None,
    out: Path,
) -> None:
    with tool_errors("bench_speed"):
        config = SpeedConfig(
            model=model,
            work_dir=work_dir,
            ladder=Ladder.parse(ladder),
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            repetitions=repetitions,
            arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
            against=against,
        )
        results = run_speed(
            config,
            EXACT_CPU_PROPERTIES,
            on_progress=lambda m: click.echo(f"bench_speed: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_speed.py", *sys.argv[1:]])
    page = write_page(out, PAGE, results)
    click.echo(page.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
