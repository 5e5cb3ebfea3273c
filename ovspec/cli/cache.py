"""``ovspec cache``: list, count, check, trim and compare the entries of the blob store.

A thin layer over ``ovspec.store.Store``; every subcommand opens the store strict,
so storage failures surface as ``StoreError`` (one line, exit 2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import click

from ovspec.cli import cli
from ovspec.cli.options import trust_shared_store_option
from ovspec.store.keys import explain as explain_keys
from ovspec.store.local import Store, StoreEntry

_F = TypeVar("_F", bound=Callable[..., object])

_HEX_SHOWN = 12
_CELL_CHARS = 32


def _cache_dir_option(f: _F) -> _F:
    option = click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="OVSPEC_CACHE_DIR",
        default=None,
        help="Store folder. [default: $OVSPEC_CACHE_DIR, else the user cache folder]",
    )
    return option(trust_shared_store_option(f))


def _json_option(f: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def _open(cache_dir: Path | None, *, repair: bool = False) -> Store:
    """``repair``: open a store that has a link where a folder belongs, to report it
    (check) or replace it (check --fix, gc, clear)."""
    root = cache_dir if cache_dir is not None else Store.default_root()
    return Store(root, strict=True, repair=repair)


def _echo_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _when(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


def _cell(text: str) -> str:
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 1] + "…"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(r) for r in rows)]


@cli.group()
def cache() -> None:
    """Inspect and maintain the blob store."""


@cache.command("ls")
@_cache_dir_option
@_json_option
def ls(cache_dir: Path | None, as_json: bool) -> None:
    """List stored blobs, most recently used first."""
    with _open(cache_dir) as store:
        entries = store.entries()
        if as_json:
            _echo_json([e.to_json() for e in entries])
            return
        if not entries:
            click.echo(f"no entries in {store.root}")
            return
        rows = [
            [
                e.hex[:_HEX_SHOWN],
                _cell(e.values().get("specialization", "")),
                _cell(e.values().get("device", "")),
                _human_bytes(e.size_bytes),
                f"{e.compile_s:.2f}",
                _when(e.accessed_unix_s),
            ]
            for e in entries
        ]
        header = ["KEY", "SPECIALIZATION", "DEVICE", "SIZE", "COMPILE S", "LAST ACCESS"]
        for text in _table(header, rows, right={3, 4}):
            click.echo(text)


@cache.command()
@_cache_dir_option
@_json_option
def stats(cache_dir: Path | None, as_json: bool) -> None:
    """Hits, misses, compile seconds saved, bytes stored, evictions."""
    with _open(cache_dir) as store:
        s = store.stats()
        if as_json:
            _echo_json({"root": str(store.root), **s.to_json()})
            return
        lookups = s.hits + s.misses
        rate = f"{100 * s.hits / lookups:.1f}%" if lookups else "n/a"
        lines = [
            ("store", str(store.root)),
            ("entries", str(s.entries)),
            (
                "stored",
                f"{_human_bytes(s.stored_bytes)} of a {_human_bytes(s.size_limit_bytes)} limit",
            ),
            ("hits", str(s.hits)),
            ("misses", str(s.misses)),
            ("hit rate", rate),
            ("saved", f"{s.saved_s:.2f} s of compile time"),
            ("evictions", str(s.evictions)),
            ("quarantined", str(s.quarantined)),
        ]
        for name, value in lines:
            click.echo(f"{name:<12} {value}")


@cache.command()
@_cache_dir_option
@click.option("--fix", is_flag=True, help="Repair what is found (quarantine, re-index, delete).")
@_json_option
@click.pass_context
def check(ctx: click.Context, cache_dir: Path | None, fix: bool, as_json: bool) -> None:
    """Verify every payload, sidecar and index row; exit 1 if problems remain."""
    with _open(cache_dir, repair=True) as store:
        found = store.check(fix=fix)
        remaining = store.check() if fix and found else found
        if as_json:
            _echo_json(
                {"root": str(store.root), "found": found, "fixed": fix, "remaining": remaining}
            )
        elif not found:
            n = len(store.entries())
            click.echo(f"store OK: {n} entries in {store.root}")
        else:
            for problem in found:
                click.echo(f"{'fixed' if fix else 'problem'}: {problem}")
            for problem in remaining if fix else []:
                click.echo(f"still wrong: {problem}")
            if not remaining:
                click.echo(f"store OK after {len(found)} repairs")
            elif not fix:
                click.echo(f"{len(found)} problems; run `ovspec cache check --fix` to repair")
    if remaining:
        ctx.exit(1)


@cache.command()
@_cache_dir_option
@click.option(
    "--size-limit-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Set (and persist) a new size limit before collecting.",
)
def gc(cache_dir: Path | None, size_limit_bytes: int | None) -> None:
    """Evict least-recently-used blobs down to the size limit; remove stale temps."""
    with _open(cache_dir, repair=True) as store:
        if size_limit_bytes is not None:
            store.set_size_limit(size_limit_bytes)
        report = store.gc()
        for problem in report.repaired:
            click.echo(f"repaired: {problem}")
        click.echo(
            f"evicted {report.evicted_entries} entries ({_human_bytes(report.freed_bytes)}), "
            f"removed {report.locks_removed} idle lock files and "
            f"{report.quarantine_purged} old quarantined files"
        )


@cache.command()
@_cache_dir_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(cache_dir: Path | None, yes: bool) -> None:
    """Remove every blob and reset the statistics (keeps the size limit)."""
    with _open(cache_dir, repair=True) as store:
        n = len(store.entries())
        if not yes:
            click.confirm(f"remove all {n} entries from {store.root}?", abort=True)
        removed = store.clear()
        click.echo(f"removed {removed} entries from {store.root}")


@cache.command()
@_cache_dir_option
@click.argument("a")
@click.argument("b")
@_json_option
def explain(cache_dir: Path | None, a: str, b: str, as_json: bool) -> None:
    """Name the key components that differ between entries A and B (hex prefixes)."""
    with _open(cache_dir) as store:
        entry_a: StoreEntry = store.find(a)
        entry_b: StoreEntry = store.find(b)
    diffs = explain_keys(entry_a.values(), entry_b.values())
    if as_json:
        _echo_json(
            {
                "a": entry_a.hex,
                "b": entry_b.hex,
                "differences": [{"name": d.name, "a": d.a, "b": d.b} for d in diffs],
            }
        )
        return
    ha, hb = entry_a.hex[:_HEX_SHOWN], entry_b.hex[:_HEX_SHOWN]
    if not diffs:
        click.echo(f"{ha} and {hb} have identical keys")
        return
    total = len(entry_a.components)
    click.echo(f"{ha} (a) vs {hb} (b): {len(diffs)} of {total} components differ")
    for d in diffs:
        click.echo(d.name)
        click.echo(f"  a: {d.a}")
        click.echo(f"  b: {d.b}")
