"""``ovspec build``: prewarm the store for a ladder x phases x device."""

from __future__ import annotations

from pathlib import Path

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
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder


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
    """Compile MODEL's specializations into the store (MODEL: folder or builtin:PRESET).

    A second run with the same arguments is all hits and compiles nothing.
    """
    from ovspec.compile.compiler import BlobMode
    from ovspec.compile.prewarm import BuildPlan, check_device, check_model, parse_phases, run_build
    from ovspec.ir.model_dir import BUILTIN_PREFIX, resolve_model
    from ovspec.store.local import Store

    root = cache_dir if cache_dir is not None else Store.default_root()
    # Validate before the store is opened, so bad input leaves it untouched; a
    # built-in model is the exception: it is written into the store's models/ folder.
    store = Store(root) if model.startswith(BUILTIN_PREFIX) else None
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
    llm = check_model(plan)
    store = store or Store(root)
    specs = plan.specializations()
    try:
        with progress(len(specs), f"building {len(specs)} specializations") as advance:
            report = run_build(plan, store, on_outcome=lambda _: advance(1), llm=llm)
    finally:
        store.close()

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
                    "wall_s": round(report.wall_s, 6),
                },
            }
        )
        return
    click.echo(f"model  {model_dir.root}")
    click.echo(f"store  {root}   device {device}   ladder {ladder}")
    click.echo(f"{'specialization':<22} {'key':<14} {'':<5} {'compile s':>10} {'blob bytes':>14}")
    for o in report.outcomes:
        click.echo(
            f"{o.spec.label:<22} {o.key_hex[:12]:<14} {'hit' if o.hit else 'miss':<5} "
            f"{o.compile_s:>10.3f} {o.blob_bytes:>14,}"
        )
    click.echo(
        f"{report.hits} hits, {report.misses} misses; compiled {report.compile_s:.2f} s, "
        f"saved {report.saved_s:.2f} s; {report.blob_bytes:,} blob bytes; "
        f"wall {report.wall_s:.2f} s"
    )
