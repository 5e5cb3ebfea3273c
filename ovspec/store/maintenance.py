"""Keeping a store healthy: the self-check, garbage collection and clearing.

``check`` compares index rows, payloads, sidecars and temps key by key and names
each problem (repairing it with ``fix``); ``gc`` repairs, evicts to the size limit and
drops idle locks and old quarantine; ``clear`` empties the store but its settings.
Each runs under the caller's ``Store.locked_io``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ovspec.store.files import hash_file, unlink
from ovspec.store.index import STAT_EVICTIONS
from ovspec.store.layout import HEX_RE, LOCK_RE, PAYLOAD_RE, SIDECAR_RE, TEMP_RE
from ovspec.store.locks import KeyLock
from ovspec.store.records import (
    GcReport,
    StoreEntry,
    StoreUsage,
    components_match_hex,
    record_json,
    row_json,
)

if TYPE_CHECKING:
    from ovspec.store.local import Store

log = logging.getLogger(__name__)

# A temp file whose key lock is free is stale at once; one whose name does not
# say which key it belongs to is stale after this age.
STALE_TEMP_S = 3600.0
# gc() deletes quarantined payloads older than this.
QUARANTINE_KEEP_S = 7 * 24 * 3600.0
# gc() deletes model folders under models/ unused for this long (a model folder's
# LAST_USED file is touched each time ovspec resolves it; they are rebuilt on demand).
MODEL_KEEP_S = 7 * 24 * 3600.0
MODEL_LAST_USED = ".last-used"


def evict(store: Store, keep: str | None) -> tuple[int, int]:
    """Evict least-recently-used entries until under the limit.

    Never evicts ``keep`` (the entry just written) nor the last entry left, so
    a single blob over the limit is kept (with a warning). Entries whose lock
    is busy are skipped. Returns (entries evicted, bytes freed).
    """
    limit = store.size_limit_bytes
    entries = store.entries()
    total = sum(e.size_bytes for e in entries)
    evicted = freed = 0
    if total <= limit:
        return 0, 0
    victims = sorted(
        (e for e in entries if e.hex != keep),
        key=lambda e: (e.accessed_unix_s, e.created_unix_s),
    )
    remaining = len(entries)
    for victim in victims:
        if total <= limit or remaining <= 1:
            break
        with store.try_lock(victim.hex) as got:
            if not got or not store.delete_entry_files(victim.hex):
                continue  # busy, or another process evicted it first
        store.index.bump(STAT_EVICTIONS)
        log.info("evicted blob %s (%d bytes)", victim.hex[:12], victim.size_bytes)
        total -= victim.size_bytes
        remaining -= 1
        evicted += 1
        freed += victim.size_bytes
    if total > limit:
        store.warn(
            f"blob store {store.root} holds {total} bytes, over its size limit of "
            f"{limit} bytes after evicting what it could (the newest blob is always kept)"
        )
    return evicted, freed


def check(store: Store, fix: bool) -> list[str]:
    """Problems found; with ``fix`` also repaired: orphan payloads are re-indexed when
    their sidecar verifies, else quarantined; corrupt ones are quarantined; stale
    temps deleted; sidecars rewritten from a verified row; entries over the size
    limit evicted."""
    problems = _check(store, fix)
    limit = store.size_limit_bytes
    entries = store.entries()
    total = sum(e.size_bytes for e in entries)
    if total > limit and len(entries) > 1:
        problems.append(
            f"store holds {total} bytes in {len(entries)} entries, over its size "
            f"limit of {limit} bytes"
        )
        if fix:
            store.evict_to_limit(keep=None)
    return problems


def _check(store: Store, fix: bool) -> list[str]:
    layout = store.layout
    problems: list[str] = []
    if not layout.format_file.is_file():
        problems.append("FORMAT file missing")
        if fix:
            layout.ensure_format()
    problems += store.index.check(fix)

    hexes: set[str] = set()
    for hex_ in store.index.row_hexes():
        if HEX_RE.fullmatch(hex_):
            hexes.add(hex_)
            continue
        problems.append(f"index: row {'entry:' + hex_!r} does not name a key")
        if fix:
            store.index.drop_row(hex_)
    for path in sorted(layout.blobs.glob("*")):
        if not path.is_dir():
            problems.append(f"unexpected file blobs/{path.name}")
            if fix:
                store.files.move_to_quarantine(path)
            continue
        for child in sorted(path.iterdir()):
            m = PAYLOAD_RE.fullmatch(child.name) or SIDECAR_RE.fullmatch(child.name)
            if m is None or m["hex"][:2] != path.name:
                problems.append(f"unexpected file blobs/{path.name}/{child.name}")
                if fix:
                    store.files.move_to_quarantine(child)
                continue
            hexes.add(m["hex"])
    temps: dict[str, list[Path]] = {}
    now = time.time()
    for path in sorted(layout.tmp.iterdir()):
        m = TEMP_RE.fullmatch(path.name)
        if m is not None:
            temps.setdefault(m["hex"], []).append(path)
            hexes.add(m["hex"])
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - path.stat().st_mtime > STALE_TEMP_S:
                problems.append(f"stale temp file tmp/{path.name}")
                if fix:
                    unlink(path)

    for hex_ in sorted(hexes):
        with store.try_lock(hex_) as got:
            if got:  # else a producer is writing this key right now
                problems += _check_key(store, hex_, temps.get(hex_, []), fix)
    return problems


def _check_key(store: Store, hex_: str, temps: list[Path], fix: bool) -> list[str]:
    """Check one key's row, payload, sidecar and temps. Caller holds its lock."""
    problems: list[str] = []
    short = hex_[:12]
    for t in temps:
        problems.append(f"stale temp file tmp/{t.name} from an interrupted write of {short}")
        if fix:
            unlink(t)

    try:
        row = store.get_row(hex_)
    except ValueError as exc:
        problems.append(f"entry {short}: index row is malformed ({exc})")
        if fix:
            store.index.drop_row(hex_)
        row = None
    sidecar: StoreEntry | None
    sidecar_bad = False
    try:
        sidecar = store.files.read_sidecar(hex_)
    except ValueError as exc:
        problems.append(f"entry {short}: sidecar is malformed ({exc})")
        sidecar, sidecar_bad = None, True
    measured = hash_file(store.layout.payload_path(hex_))

    def matches(e: StoreEntry | None) -> bool:
        return (
            e is not None
            and measured == (e.size_bytes, e.checksum)
            and components_match_hex(e.components, hex_)
        )

    if row is not None:
        if measured is None:
            problems.append(f"entry {short}: payload missing (index row without payload)")
            if fix:
                store.delete_entry_files(hex_)
        elif matches(row):
            if sidecar is None:
                if not sidecar_bad:
                    problems.append(f"entry {short}: sidecar missing")
                if fix:
                    store.files.write_sidecar(row)
            elif record_json(sidecar) != record_json(row):
                problems.append(f"entry {short}: sidecar disagrees with the index row")
                if fix:
                    store.files.write_sidecar(row)
        elif matches(sidecar):
            problems.append(
                f"entry {short}: index row disagrees with the payload (the sidecar matches)"
            )
            if fix and sidecar is not None:
                store.set_row(dataclasses.replace(sidecar, accessed_unix_s=time.time()))
        else:
            problems.append(f"entry {short}: payload corrupt (size or checksum mismatch)")
            if fix:
                store.quarantine_entry(hex_)
    elif measured is not None:
        if matches(sidecar) and sidecar is not None:
            problems.append(f"payload {short} has no index row (its sidecar verifies)")
            if fix:
                store.index.add_row(
                    hex_, row_json(dataclasses.replace(sidecar, accessed_unix_s=time.time()))
                )
        else:
            problems.append(f"payload {short} has no index row and no valid sidecar")
            if fix:
                store.quarantine_entry(hex_)
    elif sidecar is not None or sidecar_bad:
        problems.append(f"sidecar {short} has no payload")
        if fix:
            unlink(store.layout.sidecar_path(hex_))
    return problems


def remove_stale_temps(store: Store) -> int:
    removed = 0
    now = time.time()
    for path in store.layout.tmp.iterdir():
        m = TEMP_RE.fullmatch(path.name)
        if m is None:
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > STALE_TEMP_S:
                    removed += unlink(path)
            continue
        with store.try_lock(m["hex"]) as got:
            if got:
                removed += unlink(path)
    return removed


def gc(store: Store) -> GcReport:
    repaired = _check(store, fix=True)
    evicted, freed = store.evict_to_limit(keep=None)
    live = set(store.index.row_hexes())
    locks_removed = 0
    for path in store.layout.locks.iterdir():
        m = LOCK_RE.fullmatch(path.name)
        if m is None or m["hex"] in live:
            continue
        lock = KeyLock(path)
        if lock.acquire(blocking=False):
            try:
                # Unlinking while holding it: later acquirers notice the inode change
                # and reopen (see KeyLock).
                if m["hex"] not in set(store.index.row_hexes()):
                    locks_removed += unlink(path)
            finally:
                lock.release()
    purged = 0
    cutoff = time.time() - QUARANTINE_KEEP_S
    for path in store.layout.quarantine.iterdir():
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                purged += unlink(path)
    return GcReport(
        evicted_entries=evicted,
        freed_bytes=freed,
        repaired=tuple(repaired),
        locks_removed=locks_removed,
        quarantine_purged=purged,
        models_removed=_remove_unused_models(store, time.time() - MODEL_KEEP_S),
    )


def _remove_unused_models(store: Store, cutoff_unix_s: float) -> int:
    """Model folders last used before the cutoff, and half-written ones (a writer's
    staging folder, ``.NAME.*.tmp``) older than a stale temp."""
    folder = store.layout.models
    if not folder.is_dir():
        return 0
    removed = 0
    for path in folder.iterdir():
        if not path.is_dir() or path.is_symlink():
            continue
        if path.name.startswith("."):
            used = path.stat().st_mtime
            stale = used < time.time() - STALE_TEMP_S
        else:
            marker = path / MODEL_LAST_USED
            used = marker.stat().st_mtime if marker.is_file() else path.stat().st_mtime
            stale = used < cutoff_unix_s
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path``, never following symlinks."""
    if not path.exists() or path.is_symlink():
        return 0
    if path.is_file():
        return path.lstat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = (Path(dirpath) / name).lstat()
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def usage(store: Store) -> StoreUsage:
    layout = store.layout
    blobs = _tree_bytes(layout.blobs)
    models = _tree_bytes(layout.models)
    index = _tree_bytes(layout.index) + _tree_bytes(layout.digests)
    total = _tree_bytes(layout.root)
    return StoreUsage(
        blobs_bytes=blobs,
        models_bytes=models,
        index_bytes=index,
        other_bytes=max(total - blobs - models - index, 0),
    )


def clear(store: Store) -> int:
    removed = sum(store.remove(h) for h in store.index.row_hexes())
    for path in store.layout.blobs.glob("*/*"):
        m = PAYLOAD_RE.fullmatch(path.name) or SIDECAR_RE.fullmatch(path.name)
        if m is None:
            unlink(path)
            continue
        with store.try_lock(m["hex"]) as got:
            if got:
                unlink(path)
    for path in store.layout.quarantine.iterdir():
        unlink(path)
    remove_stale_temps(store)
    store.index.reset_counters()
    # Models written into the store and the digest memo are derived data: both are
    # made again on demand.
    for folder in (store.layout.models, store.layout.digests):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
    return removed
