#!/usr/bin/env python3
"""Serving benchmark: one seeded trace through `ovspec serve` at batch 1 and batched
(the official openai client, streaming) and through genai's ContinuousBatchingPipeline,
a fresh process per arm and repetition. Regenerates docs/benchmarks/serve.md, its plot
and docs/benchmarks/results/serve.json:

    python tools/bench_serve.py                        # the 0.5B preset, ~12 min on 2 quiet cores
    python tools/bench_serve.py --model builtin:tiny --requests 4 --repetitions 1 --out /tmp/s
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.bench.serve.page import PLOT_NAME, plot_kv
from ovspec.bench.serve.runner import PAGE, run_serve
from ovspec.bench.serve.trace import TraceSpec
from ovspec.cli import tool_errors
from ovspec.extras import require_extra
from ovspec.ladder import Ladder

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:qwen2.5-0.5b", show_default=True)
@click.option("--ladder", default="256,512,1K", show_default=True, help="Per-sequence rungs.")
@click.option("--clients", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--requests", type=click.IntRange(1, 10_000), default=16, show_default=True)
@click.option("--rate", "rate_per_s", type=click.FloatRange(0.001), default=2.0, show_default=True)
@click.option("--prompt-tokens", default="64,384", show_default=True, help="MIN,MAX.")
@click.option("--output-tokens", default="32,192", show_default=True, help="MIN,MAX.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--repetitions", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--genai-cache-gb",
    type=click.IntRange(1, 1024),
    default=1,
    show_default=True,
    help="KV cache of genai's ContinuousBatchingPipeline (its SchedulerConfig.cache_size).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "serve",
    show_default=True,
    help="The store with the model, kept between runs.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where serve.md, its plot and results/serve.json go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results document, not the page.")
def main(
    model: str,
    ladder: str,
    clients: int,
    requests: int,
    rate_per_s: float,
    prompt_tokens: str,
    output_tokens: str,
    seed: int,
    repetitions: int,
    genai_cache_gb: int,
    work_dir: Path,
    out: Path,
    as_json: bool,
) -> None:
    with tool_errors("bench_serve"):
        require_extra("bench", "tools/bench_serve.py")
        require_extra("serve", "tools/bench_serve.py")
        spec = TraceSpec(requests, rate_per_s, _pair(prompt_tokens), _pair(output_tokens), seed)
        results = run_serve(
            model,
            work_dir,
            spec,
            clients,
            Ladder.parse(ladder),
            repetitions,
            genai_cache_gb=genai_cache_gb,
            on_progress=lambda m: click.echo(f"bench_serve: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_serve.py", *sys.argv[1:]])
    page = write_page(out, PAGE, results)
    plot_kv(results, out / PLOT_NAME)
    if as_json:
        click.echo(json.dumps(results))
        return
    click.echo(page.read_text(encoding="utf-8"))


def _pair(text: str) -> tuple[int, int]:
    from ovspec.errors import BadRequestError

    low, _, high = text.partition(",")
    if not (low.strip().isdigit() and high.strip().isdigit()):
        raise BadRequestError(f"give MIN,MAX token counts, got {text!r}")
    return int(low), int(high)


if __name__ == "__main__":
    main()
