"""``ovspec bench``: B0, B1, I1, I2 and I3 side by side, in Williams order, fresh processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    SEED,
    cache_dir_option,
    check_device,
    checked_model,
    chunk_option,
    compress_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
    model_folder,
    repeats_range,
    split_option,
    tokens_range,
)
from ovspec.errors import BadRequestError
from ovspec.extras import require_extra
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.bench.protocols.metrics import RunFigures
    from ovspec.bench.protocols.setups import Protocol
    from ovspec.ir.compression import Compression


@cli.command()
@click.argument("model")
@ladder_option
@click.option("--prompt-tokens", type=tokens_range(), default=128, show_default=True)
@click.option(
    "--new-tokens",
    type=tokens_range(),
    default=None,
    help="Teacher-forced tokens after the prompt [default: up to the top rung].",
)
@click.option(
    "--repetitions",
    type=repeats_range(),
    default=4,
    show_default=True,
    help="Rows of the Williams design (balanced at multiples of 2x the protocols when "
    "their number is odd, of their number when even).",
)
@click.option(
    "--protocols",
    default="B0,B1,I1,I2,I3",
    show_default=True,
    help="Which protocols to run (the control I1 always); I3 needs page-aligned rungs; "
    "auto plans from a calibration run's costs.",
)
@click.option(
    "--variants",
    default="cold,warm",
    show_default=True,
    help="cold: an empty store per run (compile figures); warm: a prebuilt store.",
)
@device_options
@chunk_option
@split_option(None)
@click.option(
    "--shared-too/--no-shared-too",
    default=False,
    show_default=True,
    help="With --split, also run every protocol on shared cores (the cost of sharing).",
)
@click.option(
    "--load-mode",
    type=click.Choice(("import", "compile")),
    default="import",
    show_default=True,
    help="How every protocol loads its graphs (the split needs import: the host builds "
    "into the store and the decode imports).",
)
@compress_option
@click.option(
    "--page",
    "page_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write the generated page: DIR/results/bench.json and DIR/bench.md "
    "(e.g. docs/benchmarks).",
)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds tokens and order.")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where runs, report.json and plots go [default: ./ovspec-bench].",
)
@click.option("--plots/--no-plots", default=True, show_default=True)
@cache_dir_option
@json_option
def bench(
    model: str,
    ladder: Ladder,
    prompt_tokens: int,
    new_tokens: int | None,
    repetitions: int,
    protocols: str,
    variants: str,
    device: str,
    config: tuple[tuple[str, str], ...],
    chunk_tokens: int,
    split: bool | None,
    shared_too: bool,
    load_mode: str,
    compression: Compression,
    page_dir: Path | None,
    seed: int,
    out_dir: Path | None,
    plots: bool,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Measure the decode protocols on MODEL (folder or builtin:PRESET).

    Every run is a fresh process; cold runs use an empty store each, so their
    compile figures are real compiles. Properties default to exact f32 on CPU,
    without thread pinning, for every protocol.
    """
    require_extra("bench", "ovspec bench")
    from ovspec.bench.protocols.report import environment, render_text, to_json, write_plots
    from ovspec.bench.protocols.runner import BenchConfig, run_bench
    from ovspec.compile.devices import profile_for
    from ovspec.compile.split import CoreSplit

    properties = dict(config) if config else dict(profile_for(device).exact_properties)
    work = out_dir or Path("ovspec-bench")
    cores = CoreSplit.default() if split is not False else None
    if split and cores is None:
        raise BadRequestError("--split needs at least 2 usable cores; this process has 1")
    if cores is not None and load_mode != "import":
        raise BadRequestError("--split builds on the host and imports: use --load-mode import")
    chosen = _protocols(protocols)
    checked_model(model, ladder)  # every check before a built-in model is written
    check_device(device, properties)
    model_dir = model_folder(model, cache_dir)
    bench_config = BenchConfig(
        model=model_dir,
        ladder=ladder,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens if new_tokens is not None else ladder.top_tokens - prompt_tokens,
        repetitions=repetitions,
        variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
        device=device,
        properties=properties,
        prefill_chunk_tokens=chunk_tokens,
        seed=seed,
        work_dir=work / "runs",
        protocols=chosen,
        split=cores,
        shared_too=shared_too,
        load_mode=load_mode,
        compression=str(compression),
    )
    total = len(bench_config.arms) * repetitions * len(bench_config.protocols)

    done = 0

    def progress(figures: RunFigures) -> None:
        nonlocal done
        done += 1
        click.echo(
            f"[{done}/{total}] {figures.variant} repetition {figures.repetition} "
            f"{figures.protocol}: critical path {figures.critical_path_s:.2f} s",
            err=True,
        )

    result = run_bench(bench_config, on_run=progress)
    env = environment()
    document = to_json(result, env)
    work.mkdir(parents=True, exist_ok=True)
    (work / "report.json").write_text(json.dumps(document, indent=2))
    text = render_text(result, env)
    (work / "report.txt").write_text("\n".join(text) + "\n")
    written = write_plots(result, work) if plots else []
    if page_dir is not None:
        from ovspec.bench.common.pages import write_page
        from ovspec.bench.protocols.page import page_document

        command = "ovspec bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "ovspec bench"
        written.append(write_page(page_dir, "bench", page_document(result, env, command)))
    if as_json:
        emit_json(document)
        return
    click.echo("\n".join(text))
    click.echo(
        f"\nwrote {work / 'report.txt'}, {work / 'report.json'}"
        + "".join(f", {p}" for p in written),
        file=sys.stdout,
    )


def _protocols(text: str) -> tuple[Protocol, ...]:
    from ovspec.bench.protocols.setups import Protocol

    names = [p.strip().upper() for p in text.split(",") if p.strip()]
    known = {p.value.upper(): p for p in Protocol}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BadRequestError(f"--protocols takes a list of {', '.join(known)} (got {text!r})")
    return tuple(known[n] for n in dict.fromkeys(names))
