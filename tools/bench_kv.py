#!/usr/bin/env python3
"""KV-layout benchmark: remap against copy-and-grow (with and without pre-fault), one run.

Part 1 grows a cache shaped like the model's KV across a ladder of boundaries (bytes
copied, time, the pre-faulted copy against memcpy). Part 2 decodes one token sequence
with every layout in lockstep through the real graphs (physical and reserved KV over
the run, decode speed per band, logits). Writes the page docs/benchmarks/kv.md, its
plot and a JSON document; asserts nothing on time.

    python tools/bench_kv.py                  # the page's figures (0.5B-shaped model)
    python tools/bench_kv.py --model builtin:tiny --boundary-ladder 64,128,256,512,1024 \\
        --ladder 64,128,256,512 --prompt-tokens 16 --repetitions 3 --out /tmp/kv.md
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.commandline import model_options, progress_printer
from ovspec.bench.common.pages import results_path
from ovspec.bench.kv.boundaries import DECODE_ARMS, run_boundaries
from ovspec.bench.kv.decode import DecodeConfig, run_decode
from ovspec.bench.kv.page import (
    environment,
    load_average,
    render,
    results_document,
    write_plot,
)
from ovspec.cli.options import chunk_option, device_options
from ovspec.errors import OvspecError
from ovspec.ladder import Ladder

DEFAULT_OUT = Path("docs/benchmarks/kv.md")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@model_options("Where built-in models are written and reused; its store/ keeps compiled graphs.")
@click.option(
    "--boundary-ladder",
    default="256,512,1024,2048,4096,8192",
    show_default=True,
    help="Capacities whose boundaries part 1 grows across.",
)
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    default=9,
    show_default=True,
    help="Samples per boundary and arm in part 1.",
)
@click.option(
    "--ladder",
    "ladder_text",
    default="64,128,256,512,640,768,896,1024",
    show_default=True,
    help="The decode run's ladder (page-aligned for remap); the direct graph is its top. "
    "Fine steps at the top show copy-and-grow's old + new buffers above the direct graph's.",
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--prefault-lead", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--direct/--no-direct",
    default=True,
    show_default=True,
    help="Decode the direct (B0) graph too in part 2.",
)
@click.option(
    "--decode-passes",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Decode passes: the first with every arm (memory, logits); the others only "
    "copy-and-grow against remap, every graph loaded before its rung's first timed step. "
    "All passes pool into the per-band speed comparison.",
)
@chunk_option
@device_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="The page to write; its plot (.png) goes beside it, its results to results/*.json.",
)
@click.option(
    "--render-only",
    is_flag=True,
    help="Only render the page again from its saved results (after a text change).",
)
def main(
    model_reference: str,
    models_dir: Path,
    boundary_ladder: str,
    repetitions: int,
    ladder_text: str,
    prompt_tokens: int,
    prefault_lead: int,
    direct: bool,
    decode_passes: int,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    seed: int,
    out: Path,
    render_only: bool,
) -> None:
    """Benchmark the KV layouts; progress to stderr, the page to --out."""
    if render_only:
        render_saved(out)
        return
    from ovspec.compile.devices import profile_for
    from ovspec.ir.model_dir import resolve_model
    from ovspec.ir.specialize import prepare, read_ir

    command = shlex.join(["python", "tools/bench_kv.py", *sys.argv[1:]])
    started = time.perf_counter()
    say = progress_printer(started)
    loads = [load_average()]

    try:
        model_dir = resolve_model(model_reference, models_dir / "models")
        roles = prepare(read_ir(model_dir.xml_path)).roles
        samples = run_boundaries(roles, Ladder.parse(boundary_ladder), repetitions, say)
        properties = dict(config) or dict(profile_for(device).exact_properties)
        arms = tuple(a for a in DECODE_ARMS if direct or a != "direct (B0)")
        decode_config = DecodeConfig(
            model=model_dir.root,
            ladder=Ladder.parse(ladder_text),
            prompt_tokens=prompt_tokens,
            prefill_chunk_tokens=chunk_tokens,
            properties=properties,
            store=models_dir / "store",
            seed=seed,
            prefault_lead_tokens=prefault_lead,
            arms=arms,
            passes=decode_passes,
        )
        run = run_decode(decode_config, say)
    except OvspecError as exc:
        click.echo(f"bench_kv: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    loads.append(load_average())
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = write_plot(run, out.with_suffix(".png"))
    results = results_document(
        command,
        environment(),
        (loads[0], loads[1]),
        model_reference,
        samples,
        boundary_ladder,
        repetitions,
        run,
        plot.name,
        time.perf_counter() - started,
    )
    saved = results_path(out.parent, out.stem)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    out.write_text(render(results), encoding="utf-8")
    say(f"wrote {out}, {plot}, {saved}")


def render_saved(out: Path) -> None:
    """Render the page again from its saved results (the plot is left as it is)."""
    saved = results_path(out.parent, out.stem)
    if not saved.is_file():
        click.echo(f"bench_kv: error: no saved results at {saved}; run the benchmark", err=True)
        sys.exit(2)
    out.write_text(render(json.loads(saved.read_text(encoding="utf-8"))), encoding="utf-8")


if __name__ == "__main__":
    main()
