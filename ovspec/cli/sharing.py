"""``ovspec cache push|pull MODEL``: move a whole ladder between the store and its remote.

A thin layer over ``ovspec.compile.sharing``; the remote comes from ``--remote`` or
``OVSPEC_REMOTE``. Exit 1 when a specialization could not be moved (each says why).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli.cache import cache
from ovspec.cli.options import (
    announce,
    check_device,
    checked_model,
    emit_json,
    json_option,
    open_store,
    specialization_options,
    store_options,
)
from ovspec.cli.units import human_bytes, plural
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder
from ovspec.store.tier import TransferStatus

if TYPE_CHECKING:
    from ovspec.compile.sharing import SharingReport, SpecTransfer
    from ovspec.store.remote import RemoteConfig


def _finish(ctx: click.Context, report: SharingReport, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_json())
    else:
        counts = ", ".join(
            f"{report.count(status)} {status.value}"
            for status in TransferStatus
            if report.count(status)
        )
        click.echo(
            f"{plural(len(report.transfers), 'specialization')}: {counts}; moved "
            f"{human_bytes(report.moved_bytes)} in {report.wall_s:.2f} s"
        )
    if not report.ok:
        ctx.exit(1)


def _transfer_command(direction: str, help_text: str) -> click.Command:
    """``cache push`` or ``cache pull``: the same options and steps, one way or the other."""

    @click.argument("model")
    @specialization_options
    @store_options
    @json_option
    @click.pass_context
    def transfer(
        ctx: click.Context,
        model: str,
        ladder: Ladder,
        phases: str,
        chunk_tokens: int,
        device: str,
        config: tuple[tuple[str, str], ...],
        compression: Compression,
        blob_mode: str,
        cache_dir: Path | None,
        remote: RemoteConfig | None,
        as_json: bool,
    ) -> None:
        from ovspec.compile import sharing
        from ovspec.compile.modes import BlobMode
        from ovspec.compile.prewarm import BuildPlan, parse_phases
        from ovspec.ir.model_dir import resolve_model
        from ovspec.store.local import Store

        if remote is None:
            raise BadRequestError(
                f"cache {direction} needs a remote: give {arg('remote', 's3://BUCKET/PREFIX')} "
                "or set OVSPEC_REMOTE"
            )
        root = cache_dir if cache_dir is not None else Store.default_root()
        # Every check before the store is opened (a built-in model is written into it).
        checked_model(model, ladder)
        parsed_phases = parse_phases(phases)
        check_device(device, dict(config))
        store = open_store(root, remote)
        try:
            model_dir = resolve_model(model, store.models_folder, announce=announce)
            plan = BuildPlan(
                model=model_dir,
                ladder=ladder,
                phases=parsed_phases,
                chunk_tokens=chunk_tokens,
                device=device,
                properties=dict(config),
                compression=compression,
                blob_mode=BlobMode(blob_mode),
            )

            def moved(item: SpecTransfer) -> None:
                if as_json:
                    return
                t = item.transfer
                size = f"{human_bytes(t.moved_bytes):>10}" if t.moved_bytes else f"{'':>10}"
                note = f"  {t.note}" if t.note else ""
                click.echo(
                    f"{item.spec.label:<22} {t.hex[:12]:<14} {t.status.value:<12} {size}{note}"
                )
                sys.stdout.flush()

            if not as_json:
                click.echo(
                    f"{direction} {model_dir.root} {'to' if direction == 'push' else 'from'} "
                    f"{remote.url}   ladder {ladder}"
                )
            run = sharing.push if direction == "push" else sharing.pull
            report = run(plan, store, on_transfer=moved)
        finally:
            store.close()
        _finish(ctx, report, as_json)

    return cache.command(direction, help=help_text)(transfer)


push = _transfer_command(
    "push",
    """Upload MODEL's ladder from the store to the remote (what `ovspec build` compiled).

    Each blob is checked against its local checksum on the way out; one the store does
    not hold is reported (build it first). Exit 1 if any specialization was not moved.
    """,
)

pull = _transfer_command(
    "pull",
    """Fetch MODEL's ladder from the remote into the store, compiling nothing.

    Each blob is verified against its manifest (and its signature, with
    --remote-key-file) and imported once on this device before it is stored. Exit 1 if
    any specialization is missing on the remote or was refused.
    """,
)
