#!/usr/bin/env python3
"""NPU-plugin benchmark (issue 27): genai's static NPU pipeline, with and without its
generate pyramid, against ovspec one-ahead, all on the NPU plugin's NPUW compiling for CPU
subdevices. Every arm runs under an emulated device/host split (each gets the device
cores for inference and the host cores for compiling, as an NPU beside a host CPU would):
docs/benchmarks/npu-plugin.md and its results/npu-plugin.json. ``--no-split`` runs every
arm on every core: npu-plugin-shared-cores.md and its results.

    python tools/bench_npu.py                       # the default cases, under the split
    python tools/bench_npu.py --no-split            # the same on shared cores
    python tools/bench_npu.py --cases small-96 --repetitions 2 --out /tmp/npu   # a try
    python tools/bench_npu.py --model DIR --prompt-tokens 40 --new-tokens 30 --ladder 64,128
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import write_page
from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.bench.npu.runner import (
    CASES,
    DEFAULT_CASES,
    PAGE,
    SHARED_CORES_PAGE,
    NpuCase,
    run_npu,
)
from ovspec.cli import tool_errors
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--cases",
    default=",".join(DEFAULT_CASES),
    show_default=True,
    help=f"Comma list of {', '.join(CASES)}.",
)
@click.option(
    "--model",
    default=None,
    help="One case of this IR folder or builtin:PRESET instead of --cases (with the "
    "three options below).",
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=96, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=2), default=200, show_default=True)
@click.option("--ladder", default="128,256,512", show_default=True)
@click.option("--repetitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--split",
    "split_text",
    default="auto",
    show_default=True,
    help="DEVICE/HOST cores (e.g. 0/1) of the emulated split every arm runs under; auto: "
    "half the usable cores each.",
)
@click.option(
    "--no-split",
    is_flag=True,
    help=f"Every arm on every core instead (writes {SHARED_CORES_PAGE}.md).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR.parent / "npu",
    show_default=True,
    help="The presets' IRs, kept between runs.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where the page and its results/*.json go.",
)
def main(
    cases: str,
    model: str | None,
    prompt_tokens: int,
    new_tokens: int,
    ladder: str,
    repetitions: int,
    split_text: str,
    no_split: bool,
    work_dir: Path,
    out: Path,
) -> None:
    with tool_errors("bench_npu"):
        if model is not None:
            chosen = [NpuCase("custom", model, prompt_tokens, new_tokens, ladder)]
        else:
            names = [c.strip() for c in cases.split(",") if c.strip()]
            unknown = [n for n in names if n not in CASES]
            if unknown or not names:
                raise BadRequestError(f"--cases takes any of {', '.join(CASES)} (got {cases!r})")
            chosen = [CASES[n] for n in names]
        split = None if no_split else _split(split_text)
        results = run_npu(
            work_dir,
            chosen,
            repetitions,
            split=split,
            on_progress=lambda m: click.echo(f"bench_npu: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_npu.py", *sys.argv[1:]])
    page = write_page(out, SHARED_CORES_PAGE if split is None else PAGE, results)
    click.echo(page.read_text(encoding="utf-8"))


def _split(text: str) -> CoreSplit:
    if text != "auto":
        return CoreSplit.parse(text)
    split = CoreSplit.default()
    if split is None:
        raise BadRequestError("the split needs at least 2 usable cores; give --no-split")
    return split


if __name__ == "__main__":
    main()
