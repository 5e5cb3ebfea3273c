"""``ovspec build``: prewarm the store for a ladder x phases x device."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    blob_mode_option,
    cache_dir_option,
    chunk_option,
    compress_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
    phases_option,
    progress,
)
from ovspec.cli.units import human_bytes
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.compile.compiler import BuildOutcome


@cli.command()
@click.argument("model")
@ladder_option
@phases_option
@chunk_option
@device_options
@compress_option
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Specializations compiled at once.",
)
@blob_mode_option
@cache_dir_option
@json_option
def build(
    model: str,
    ladder: Ladder,
    phases: str,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    compression: Compression,
    jobs: int,
    blob_mode: str,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Compile MODEL's specializations into the store (MODEL: folder, .gguf or builtin:PRESET).

    A second run with the same arguments is all hits and compiles nothing (it does not
    even read or compress the model). Rows print as each specialization lands; the
    summary's wall time is the whole command's.
    """
    started = time.perf_counter()
    from ovspec.compile.compiler import BlobMode
    from ovspec.compile.prewarm import (
        BuildPlan,
        all_stored,
        check_device,
        check_model,
        parse_phases,
        run_build,
    )
    from ovspec.ir.model_dir import resolve_model, writes_into_store
    from ovspec.store.local import Store

    root = cache_dir if cache_dir is not None else Store.default_root()
    # Validate before the store is opened, so bad input leaves it untouched; a built-in
    # model or a GGUF file is the exception: its IR is written into the store's models/.
    store = Store(root) if writes_into_store(model) else None
    model_dir = resolve_model(model, store.models_folder if store else root / "models")
    plan = BuildPlan(
        model=model_dir,
        ladder=ladder,
        phases=parse_phases(phases),
        chunk_tokens=chunk_tokens,
        device=device,
        properties=dict(config),
        compression=compression,
        jobs=jobs,
        blob_mode=BlobMode(blob_mode),
    )
    check_device(plan)
    if store is None and (root / "FORMAT").is_file():
        store = Store(root)
    # Preparing the model (reading, compressing, stateless) validates it, and costs
    # seconds on a large model: skip it when every specialization is stored already.
    llm = None if store is not None and all_stored(plan, store) else check_model(plan)
    store = store or Store(root)
    specs = plan.specializations()
    if not as_json:
        click.echo(f"model  {model_dir.root}")
        click.echo(f"store  {root}   device {device}   ladder {ladder}")
        click.echo(f"{'specialization':<22} {'key':<14} {'':<5} {'compile s':>10} {'blob':>12}")

    def landed(o: BuildOutcome) -> None:
        if as_json:
            return
        click.echo(
            f"{o.spec.label:<22} {o.key_hex[:12]:<14} {'hit' if o.hit else 'miss':<5} "
            f"{o.compile_s:>10.3f} {human_bytes(o.blob_bytes):>12}"
        )
        sys.stdout.flush()  # a row per specialization as it lands, also through a pipe

    try:
        if as_json:
            with progress(len(specs), f"building {len(specs)} specializations") as advance:
                report = run_build(plan, store, on_outcome=lambda _: advance(1), llm=llm)
        else:
            report = run_build(plan, store, on_outcome=landed, llm=llm)
    finally:
        store.close()
    wall_s = time.perf_counter() - started

    if as_json:
        emit_json(
            {
                "model": str(model_dir.root),
                "device": device,
                "ladder": list(ladder),
                "cache_dir": str(root),
                "entries": [
                    {
                        "specialization": o.spec.label,
                        "phase": o.spec.phase.value,
                        "capacity_tokens": o.spec.capacity_tokens,
                        "chunk_tokens": o.spec.chunk_tokens,
                        "key": o.key_hex,
                        "hit": o.hit,
                        "compile_s": round(o.compile_s, 6),
                        "export_s": round(o.export_s, 6),
                        "wait_s": round(o.wait_s, 6),
                        "blob_bytes": o.blob_bytes,
                    }
                    for o in report.outcomes
                ],
                "totals": {
                    "hits": report.hits,
                    "misses": report.misses,
                    "compile_s": round(report.compile_s, 6),
                    "saved_s": round(report.saved_s, 6),
                    "blob_bytes": report.blob_bytes,
                    "build_s": round(report.wall_s, 6),
                    "wall_s": round(wall_s, 6),
                },
            }
        )
        return
    click.echo(
        f"{report.hits} hits, {report.misses} misses; compiled {report.compile_s:.2f} s, "
        f"saved {report.saved_s:.2f} s; {human_bytes(report.blob_bytes)} of blobs; "
        f"wall {wall_s:.2f} s (building {report.wall_s:.2f} s)"
    )
