"""``ovspec cache``: list, count, check, trim and compare the entries of the blob store.

A thin layer over ``ovspec.store.Store``; every subcommand opens the store strict, so
storage failures surface as ``StoreError`` (one line, exit 2). Commands that only
read (``ls``, ``stats``, ``check`` without ``--fix``, ``explain``) never create a store:
a mistyped folder is "no ovspec store at ...", not a new empty store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import click

from ovspec.cli import cli
from ovspec.cli.options import emit_json, trust_shared_store_option
from ovspec.cli.units import SIZE, human_bytes, plural
from ovspec.errors import StoreError
from ovspec.ir.specialize import Specialization
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
    """Open an existing store (never create one). ``repair``: open a store that has a
    link where a folder belongs, to report it (check) or replace it (check --fix, gc,
    clear)."""
    root = cache_dir if cache_dir is not None else Store.default_root()
    return Store(root, strict=True, repair=repair, create=False)


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


def spec_label(entry: StoreEntry) -> str:
    """``decode@1024`` / ``prefill@1024x128``, as ``ovspec build`` prints it."""
    label = entry.metadata.get("specialization", "")
    if label:
        return label
    text = entry.values().get("specialization", "")
    try:
        return Specialization.from_canonical(text).label
    except ValueError:
        return text


def model_label(entry: StoreEntry, store: Store) -> str:
    """The model an entry was built from: ``builtin:tiny`` for a model the store wrote,
    the ``.gguf`` file's name for one it built from a GGUF file, else the folder's name."""
    from ovspec.ir.gguf import gguf_source_name

    recorded = entry.metadata.get("model", "")
    if not recorded:
        return "?"
    path = Path(recorded)
    if store.wrote_model(path):
        source = gguf_source_name(path)
        if source is not None:
            return source
        preset, _, _digest = path.name.rpartition("-")
        return f"builtin:{preset}" if preset else path.name
    return path.name


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
            emit_json(
                [
                    {
                        **e.to_json(),
                        "label": spec_label(e),
                        "model_label": model_label(e, store),
                    }
                    for e in entries
                ]
            )
            return
        if not entries:
            click.echo(f"no entries in {store.root}")
            return
        rows = [
            [
                e.hex[:_HEX_SHOWN],
                _cell(spec_label(e)),
                _cell(model_label(e, store)),
                _cell(e.values().get("device", "")),
                human_bytes(e.size_bytes),
                f"{e.compile_s:.2f}",
                _when(e.accessed_unix_s),
            ]
            for e in entries
        ]
        header = ["KEY", "SPECIALIZATION", "MODEL", "DEVICE", "SIZE", "COMPILE S", "LAST USED"]
        for text in _table(header, rows, right={4, 5}):
            click.echo(text)


@cache.command()
@_cache_dir_option
@_json_option
def stats(cache_dir: Path | None, as_json: bool) -> None:
    """Hits, misses, compile seconds saved, bytes on disk, evictions; with a remote tier,
    its hits, the bytes moved each way and the seconds the fetches saved."""
    with _open(cache_dir) as store:
        s = store.stats()
        used = store.usage()
        if as_json:
            emit_json({"root": str(store.root), **s.to_json(), "disk": used.to_json()})
            return
        lookups = s.hits + s.misses
        rate = f"{100 * s.hits / lookups:.1f}%" if lookups else "n/a"
        lines = [
            ("store", str(store.root)),
            ("entries", str(s.entries)),
            (
                "blobs",
                f"{human_bytes(s.stored_bytes)} of a {human_bytes(s.size_limit_bytes)} limit",
            ),
            ("models", human_bytes(used.models_bytes)),
            ("index", human_bytes(used.index_bytes)),
            ("other", human_bytes(used.other_bytes) + " (quarantine, temps, locks)"),
            ("on disk", human_bytes(used.total_bytes)),
            ("hits", str(s.hits)),
            ("misses", str(s.misses)),
            ("hit rate", rate),
            ("saved", f"{s.saved_s:.2f} s of compile time"),
            ("evictions", str(s.evictions)),
            ("quarantined", str(s.quarantined)),
        ]
        r = s.remote
        if r.hits or r.misses or r.uploads or r.refused or r.failures:
            bandwidth = r.fetch_bytes_per_s
            lines += [
                ("remote hits", f"{r.hits} (misses {r.misses}, refused {r.refused})"),
                (
                    "fetched",
                    f"{human_bytes(r.fetched_bytes)} in {r.fetch_s:.2f} s"
                    + (f" ({bandwidth / 1e6:.1f} MB/s)" if bandwidth else ""),
                ),
                (
                    "uploaded",
                    f"{r.uploads} blobs, {human_bytes(r.uploaded_bytes)} in {r.upload_s:.2f} s",
                ),
                (
                    "remote saved",
                    f"{r.saved_s:.2f} s ({r.saved_compile_s:.2f} s of compiles "
                    f"replaced by {r.fetch_s:.2f} s of fetches)",
                ),
                ("unreachable", f"{r.failures} times"),
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
            emit_json(
                {"root": str(store.root), "found": found, "fixed": fix, "remaining": remaining}
            )
        elif not found:
            n = len(store.entries())
            click.echo(f"store OK: {plural(n, 'entry', 'entries')} in {store.root}")
        else:
            for problem in found:
                click.echo(f"{'fixed' if fix else 'problem'}: {problem}")
            for problem in remaining if fix else []:
                click.echo(f"still wrong: {problem}")
            if not remaining:
                click.echo(f"store OK after {plural(len(found), 'repair')}")
            elif not fix:
                click.echo(
                    f"{plural(len(found), 'problem')}; run `ovspec cache check --fix` to repair"
                )
    if remaining:
        ctx.exit(1)


@cache.command()
@_cache_dir_option
@click.option(
    "--size-limit",
    "size_limit_bytes",
    type=SIZE,
    default=None,
    help="Set (and persist) a new size limit for blobs before collecting: 10G, 512M, 4096B "
    "(a unit is required).",
)
@_json_option
def gc(cache_dir: Path | None, size_limit_bytes: int | None, as_json: bool) -> None:
    """Evict least-recently-used blobs down to the size limit; remove stale temps, idle
    locks, old quarantine and model folders unused for a week."""
    with _open(cache_dir, repair=True) as store:
        if size_limit_bytes is not None:
            store.set_size_limit(size_limit_bytes)
        report = store.gc()
        if as_json:
            emit_json(
                {"root": str(store.root), "size_limit_bytes": store.size_limit_bytes}
                | report.to_json()
            )
            return
        for problem in report.repaired:
            click.echo(f"repaired: {problem}")
        click.echo(
            f"evicted {plural(report.evicted_entries, 'entry', 'entries')} "
            f"({human_bytes(report.freed_bytes)}), removed "
            f"{plural(report.locks_removed, 'idle lock file')}, "
            f"{plural(report.quarantine_purged, 'old quarantined file')} and "
            f"{plural(report.models_removed, 'unused model folder')}"
        )


@cache.command()
@_cache_dir_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_json_option
def clear(cache_dir: Path | None, yes: bool, as_json: bool) -> None:
    """Remove every blob, written model and memo, and reset the statistics (keeps the
    size limit). Asks first unless --yes; answering no changes nothing."""
    with _open(cache_dir, repair=True) as store:
        n = len(store.entries())
        before = store.usage().total_bytes
        if not yes and not click.confirm(
            f"remove all {plural(n, 'entry', 'entries')} and written models from {store.root}?",
            err=True,
        ):
            if as_json:
                emit_json({"root": str(store.root), "cleared": False, "removed_entries": 0})
            else:
                click.echo(f"left {store.root} as it was")
            return
        removed = store.clear()
        freed = before - store.usage().total_bytes
        if as_json:
            emit_json(
                {
                    "root": str(store.root),
                    "cleared": True,
                    "removed_entries": removed,
                    "freed_bytes": freed,
                }
            )
            return
        click.echo(
            f"removed {plural(removed, 'entry', 'entries')} ({human_bytes(freed)}) "
            f"from {store.root}"
        )


def _resolve(store: Store, reference: str, model: str | None) -> StoreEntry:
    """An entry by hex prefix, or by specialization label (``decode@1024``), narrowed by
    the model's name when several models have one."""
    if "@" not in reference:
        return store.find(reference)
    matches = [e for e in store.entries() if spec_label(e) == reference]
    if model is not None:
        matches = [e for e in matches if model in (model_label(e, store), e.metadata.get("model"))]
    if not matches:
        raise StoreError(f"no entry is {reference!r}; see `ovspec cache ls`")
    if len(matches) > 1:
        shown = ", ".join(f"{e.hex[:_HEX_SHOWN]} ({model_label(e, store)})" for e in matches[:4])
        raise StoreError(
            f"{len(matches)} entries are {reference!r}: {shown}; give a key prefix or --model"
        )
    return matches[0]


@cache.command()
@_cache_dir_option
@click.argument("a")
@click.argument("b")
@click.option("--model", default=None, help="Pick labels of this model (as `cache ls` names it).")
@_json_option
def explain(cache_dir: Path | None, a: str, b: str, model: str | None, as_json: bool) -> None:
    """Name the key components that differ between entries A and B.

    A and B are key prefixes (from `ovspec cache ls`) or specialization labels such as
    decode@1024 (with --model when several models have one).
    """
    with _open(cache_dir) as store:
        entry_a = _resolve(store, a, model)
        entry_b = _resolve(store, b, model)
    diffs = explain_keys(entry_a.values(), entry_b.values())
    if as_json:
        emit_json(
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
