#!/usr/bin/env python3
"""What host-core work costs the split's decode, measured inside one decode: a background
process on the host core (the host's own build, an import loop, a memcpy loop as the
positive control) is stopped and continued every few steps, adjacent on/off slots are
paired so the machine's drift cancels. Regenerates docs/benchmarks/overlap.md and
docs/benchmarks/results/overlap.json:

    python tools/bench_overlap.py                                  # the page's run (~4 min)
    python tools/bench_overlap.py --decodes 1 --out /tmp/overlap   # a try
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.pages import results_path, write_page
from ovspec.bench.overlap.analysis import LOADS, PAGE, Overlap, campaign_overlap
from ovspec.bench.overlap.runner import OverlapConfig, run_overlap
from ovspec.cli import tool_errors
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder
from ovspec.store.local import Store

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:small", show_default=True)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where built-in models are written (default: the store's root, as ovspec bench).",
)
@click.option("--ladder", default="512,1024,2048", show_default=True)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=2), default=1408, show_default=True)
@click.option(
    "--decodes", type=click.IntRange(min=1), default=8, show_default=True, help="Decodes per load."
)
@click.option(
    "--slot-steps",
    type=click.IntRange(min=2),
    default=50,
    show_default=True,
    help="Steps per on or off slot.",
)
@click.option("--loads", default=",".join(LOADS), show_default=True)
@click.option(
    "--split",
    "split_text",
    default=None,
    help="DEVICE/HOST cores, e.g. 0/1 [default: half the usable cores decode].",
)
@click.option(
    "--overlap",
    "overlap_text",
    default=None,
    help="HOST_BUILD,IMPORT fractions of I2's decode the loads overlap [default: from the "
    "committed campaign, docs/benchmarks/results/bench.json].",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where overlap.md and results/overlap.json go.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/ovspec-overlap"),
    show_default=True,
)
def main(
    model: str,
    cache_dir: Path | None,
    ladder: str,
    prompt_tokens: int,
    new_tokens: int,
    decodes: int,
    slot_steps: int,
    loads: str,
    split_text: str | None,
    overlap_text: str | None,
    out: Path,
    work_dir: Path,
) -> None:
    with tool_errors("bench_overlap"):
        fractions = _overlap(overlap_text)
        split = CoreSplit.parse(split_text) if split_text else CoreSplit.default()
        if split is None:
            raise BadRequestError("the overlap benchmark needs a split: at least 2 usable cores")
        root = cache_dir if cache_dir is not None else Store.default_root()
        config = OverlapConfig(
            model=resolve_model(model, root / "models"),
            model_name=model,
            ladder=Ladder.parse(ladder),
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            decodes=decodes,
            slot_steps=slot_steps,
            loads=tuple(x.strip() for x in loads.split(",") if x.strip()),
            split=split,
            work_dir=work_dir,
            properties=dict(EXACT_CPU_PROPERTIES),
        )
        results = run_overlap(
            config,
            fractions,
            on_progress=lambda m: click.echo(f"bench_overlap: {m}", err=True),
        )
    results["command"] = shlex.join(["python", "tools/bench_overlap.py", *sys.argv[1:]])
    page = write_page(out, PAGE, results)
    click.echo(page.read_text(encoding="utf-8"))


def _overlap(text: str | None) -> Overlap | None:
    if text is not None:
        try:
            host, imports = (float(x) for x in text.split(","))
        except ValueError as exc:
            raise BadRequestError(
                f"--overlap {text!r}: give HOST_BUILD,IMPORT, e.g. 0.3,0.06"
            ) from exc
        return Overlap(host, imports, "given as --overlap")
    bench = results_path(PAGES, "bench")
    if not bench.exists():
        return None
    document = json.loads(bench.read_text(encoding="utf-8"))
    return campaign_overlap(
        document, f"medians over the split I2 runs of the committed campaign, {bench.name}"
    )


if __name__ == "__main__":
    main()
