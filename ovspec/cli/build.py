"""``ovspec build``: prewarm the store for a ladder x phases x device."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    MAX_JOBS,
    announce,
    check_device,
    checked_model,
    emit_json,
    json_option,
    open_store,
    progress,
    specialization_options,
    store_options,
)
from ovspec.cli.units import human_bytes
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.compile.modes import LoadMode
    from ovspec.compile.prewarm import BuildPlan, BuildReport
    from ovspec.compile.programs import BuildOutcome
    from ovspec.store.remote import RemoteConfig
    from ovspec.store.tier import Tier


@cli.command()
@click.argument("model")
@specialization_options
@click.option(
    "--jobs",
    type=click.IntRange(1, MAX_JOBS),
    default=1,
    show_default=True,
    help="Specializations compiled at once.",
)
@store_options
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
    remote: RemoteConfig | None,
    as_json: bool,
) -> None:
    """Compile MODEL's specializations into the store (MODEL: folder, .gguf or builtin:PRESET).

    A second run with the same arguments is all hits and compiles nothing (it does not
    even read or compress the model). With --remote, a blob another machine uploaded is
    fetched instead of compiled, and what is compiled here is uploaded. Rows print as
    each specialization lands; the summary's wall time is the whole command's.
    """
    started = time.perf_counter()
    from ovspec.compile.devices import profile_for
    from ovspec.compile.modes import BlobMode
    from ovspec.compile.prewarm import BuildPlan, all_stored, check_model, parse_phases, run_build
    from ovspec.ir.model_dir import resolve_model
    from ovspec.store.local import Store

    root = cache_dir if cache_dir is not None else Store.default_root()
    # Every check before the store is opened or a built-in model written into it, so
    # bad input leaves the store as it was.
    facts = checked_model(model, ladder)
    parsed_phases = parse_phases(phases)
    check_device(device, dict(config))
    store: Store | None = None
    if facts.model_dir is not None:
        model_dir = facts.model_dir
    else:
        store = open_store(root, remote)
        model_dir = resolve_model(model, store.models_folder, announce=announce)
    plan = BuildPlan(
        model=model_dir,
        ladder=ladder,
        phases=parsed_phases,
        chunk_tokens=chunk_tokens,
        device=device,
        properties=dict(config),
        compression=compression,
        jobs=jobs,
        blob_mode=BlobMode(blob_mode),
    )
    if store is None and (root / "FORMAT").is_file():
        store = open_store(root, remote)
    # Preparing the model (reading, compressing, stateless) validates it, and costs
    # seconds on a large model: skip it when every specialization is stored already.
    llm = None if store is not None and all_stored(plan, store) else check_model(plan)
    store = store or open_store(root, remote)
    specs = plan.specializations()
    if not as_json:
        click.echo(f"model  {model_dir.root}")
        click.echo(f"store  {root}   device {device}   ladder {ladder}")
        click.echo(f"{'specialization':<22} {'key':<14} {'':<5} {'compile s':>10} {'blob':>12}")

    def landed(o: BuildOutcome) -> None:
        if as_json:
            return
        click.echo(
            f"{o.spec.label:<22} {o.key_hex[:12]:<14} {_source(o):<5} "
            f"{o.compile_s:>10.3f} {human_bytes(o.blob_bytes):>12}"
        )
        sys.stdout.flush()  # a row per specialization as it lands, also through a pipe

    try:
        if as_json:
            with progress(len(specs), f"building {len(specs)} specializations") as advance:
                report = run_build(plan, store, on_outcome=lambda _: advance(1), llm=llm)
        else:
            report = run_build(plan, store, on_outcome=landed, llm=llm)
        tier = store.tier
        if tier is not None:
            tier.wait_for_uploads()  # failures warned; the local build stands
    finally:
        store.close()
    wall_s = time.perf_counter() - started

    notes = _notes(plan, profile_for(device, dict(config)).default_load_mode)
    if as_json:
        document = _json_document(model_dir.root, device, ladder, root, report, tier, wall_s)
        document["notes"] = notes
        emit_json(document)
        return
    for line in [*_summary(report, tier, wall_s), *notes]:
        click.echo(line)


def _notes(plan: BuildPlan, default_load_mode: LoadMode) -> list[str]:
    """What a user should know about these blobs: whether ``generate`` uses them by
    default on this device, and whether they hold the weights after all."""
    from ovspec.compile.modes import BlobMode, LoadMode
    from ovspec.ir.compression import CompressionMode
    from ovspec.ir.files import compressed_weight_types

    notes = []
    if default_load_mode is not LoadMode.IMPORT:
        notes.append(
            f"note: on {plan.device} `generate` compiles from the IR by default (load mode "
            f"{default_load_mode.value}) and does not use these blobs; --load-mode import does"
        )
    compressed = compressed_weight_types(plan.model.xml_path)
    nncf = plan.compression.mode is not CompressionMode.NONE
    if plan.blob_mode is BlobMode.WEIGHTLESS and (compressed or nncf):
        types = str(plan.compression) if nncf else ", ".join(sorted(compressed))
        notes.append(
            f"note: the weights are compressed ({types}): they go into every blob, weightless "
            "or not (measured on CPU; docs/weightless.md), not once per ladder"
        )
    return notes


def _json_document(
    model: Path,
    device: str,
    ladder: Ladder,
    root: Path,
    report: BuildReport,
    tier: Tier | None,
    wall_s: float,
) -> dict[str, object]:
    return {
        "model": str(model),
        "device": device,
        "ladder": list(ladder),
        "cache_dir": str(root),
        "remote": tier.location if tier is not None else None,
        "entries": [
            {
                "specialization": o.spec.label,
                "phase": o.spec.phase.value,
                "capacity_tokens": o.spec.capacity_tokens,
                "chunk_tokens": o.spec.chunk_tokens,
                "key": o.key_hex,
                "hit": o.hit,
                "fetched": o.fetched,
                "fetch_s": round(o.fetch_s, 6),
                "compile_s": round(o.compile_s, 6),
                "export_s": round(o.export_s, 6),
                "wait_s": round(o.wait_s, 6),
                "blob_bytes": o.blob_bytes,
            }
            for o in report.outcomes
        ],
        "totals": {
            "hits": report.hits,
            "fetched": report.fetched,
            "fetched_bytes": report.fetched_bytes,
            "uploaded": tier.uploaded if tier is not None else 0,
            "uploaded_bytes": tier.uploaded_bytes if tier is not None else 0,
            "misses": report.misses,
            "compile_s": round(report.compile_s, 6),
            "saved_s": round(report.saved_s, 6),
            "blob_bytes": report.blob_bytes,
            "build_s": round(report.wall_s, 6),
            "wall_s": round(wall_s, 6),
        },
    }


def _summary(report: BuildReport, tier: Tier | None, wall_s: float) -> list[str]:
    fetched = f"{report.fetched} fetched, " if report.fetched else ""
    lines = [
        f"{report.hits} hits, {fetched}{report.misses} misses; compiled {report.compile_s:.2f} s, "
        f"saved {report.saved_s:.2f} s; {human_bytes(report.blob_bytes)} of blobs; "
        f"wall {wall_s:.2f} s (building {report.wall_s:.2f} s)"
    ]
    if tier is not None:
        lines.append(
            f"remote {tier.location}: fetched {human_bytes(report.fetched_bytes)}, uploaded "
            f"{tier.uploaded} ({human_bytes(tier.uploaded_bytes)})"
            + (f"; not used: {tier.down}" if tier.down else "")
        )
    return lines


def _source(outcome: BuildOutcome) -> str:
    """Where a specialization came from: the local store, the remote tier, a compile."""
    return "hit" if outcome.hit else "fetch" if outcome.fetched else "miss"
