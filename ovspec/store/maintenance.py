"""Keeping a store healthy: the self-check (``check``; ``fix`` repairs), LRU eviction,
garbage collection and clearing. Every walk is ``lstat``-based and stays below the root:
a link inside the store is reported and removed, never followed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import time
from pathlib import Path

from ovspec.errors import StoreError
from ovspec.store import models, opening
from ovspec.store.core import StoreCore
from ovspec.store.files import NOT_A_FILE, hash_file, remove_path, scan_folder, unlink
from ovspec.store.index import STAT_EVICTIONS
from ovspec.store.layout import (
    FOLDER_MODE,
    HEX_RE,
    LOCK_RE,
    PAYLOAD_RE,
    SIDECAR_RE,
    STORE_LOCK_NAME,
    TEMP_RE,
)
from ovspec.store.listing import entries as list_entries
from ovspec.store.locks import KeyLock, LockTimeout
from ovspec.store.models import MODEL_KEEP_S
from ovspec.store.records import (
    GcReport,
    StoreEntry,
    StoreUsage,
    components_match_hex,
    record_json,
    row_json,
)
from ovspec.store.trust import FOLDER_NAMES, inspect

log = logging.getLogger(__name__)

STALE_TEMP_S = opening.STALE_TEMP_S
# gc() deletes quarantined payloads older than this.
QUARANTINE_KEEP_S = 7 * 24 * 3600.0


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    return "not a regular file"


def check(store: StoreCore, fix: bool) -> list[str]:
    """Problems found; with ``fix`` also repaired: links in place of folders removed,
    a damaged index rebuilt from the sidecars, orphan payloads re-indexed when their
    sidecar verifies, else quarantined; corrupt ones quarantined; stale temps deleted;
    sidecars rewritten from a verified row; entries over the size limit evicted."""
    if fix:
        store.require_writable("repair it")
    problems = _check(store, fix)
    limit = store.size_limit_bytes
    entries = list_entries(store)
    total = sum(e.size_bytes for e in entries)
    if total > limit and len(entries) > 1:
        problems.append(
            f"store holds {total} bytes in {len(entries)} entries, over its size "
            f"limit of {limit} bytes"
        )
        if fix:
            evict_to_limit(store, keep=None)
    return problems


def repair_folders(store: StoreCore, fix: bool) -> list[str]:
    """Links (or files) where the store's folders belong; replaced by empty folders
    when ``fix`` (quarantine first, so later moves land in a real folder)."""
    layout = store.layout
    report = inspect(layout)
    # Foreign ownership is not listed: such a store opens only when the user trusts it.
    problems = [f"{text}; not followed" for text in report.links]
    problems += _open_folders(store, fix)
    if not fix or not report.links:
        return problems
    order = sorted(report.bad_paths, key=lambda p: (p != "quarantine", p))
    for rel in order:
        path = layout.root / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and (stat.S_ISLNK(st.st_mode) or rel == "quarantine"):
            unlink(path)  # the link (or a file named like the quarantine), not a target
        elif st is not None:
            try:  # a file where a folder belongs, or a damaged model folder
                store.files.move_to_quarantine(path)
            except PermissionError as exc:
                # Moving a folder to another parent needs write access to the folder
                # itself: one another user owns stays until they (or root) remove it.
                raise StoreError(
                    f"blob store {store.root}: cannot move {rel} aside ({exc.strerror}); "
                    "another user owns it: ask them or root to remove it"
                ) from exc
        if rel in FOLDER_NAMES:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, FOLDER_MODE)
    if "index" in report.bad_paths:
        reopen_index(store, "was a link or a file, not a folder")
    store.access = dataclasses.replace(store.access, report=inspect(layout))
    return problems


def _open_folders(store: StoreCore, fix: bool) -> list[str]:
    """Store folders others may read or enter (models/ was made 755 before issue 29);
    made owner-only when ``fix``, as the store creates them."""
    problems = []
    for name, st in scan_folder(store.root):
        mode = stat.S_IMODE(st.st_mode)
        if name in FOLDER_NAMES and stat.S_ISDIR(st.st_mode) and mode & 0o077:
            problems.append(f"{name}/ is open to other users (mode {mode:o}), not owner-only")
            if fix:  # through an fd opened without following: never a link's target
                fd = os.open(store.root / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.fchmod(fd, FOLDER_MODE)
                finally:
                    os.close(fd)
    return problems


def reopen_index(store: StoreCore, why: str) -> None:
    """Replace the store's index with one rebuilt from the sidecars (store lock held
    inside)."""
    with opening.store_lock(store.layout, store.lock_policy):
        store.index.close()
        store.index = opening.rebuild(store.layout, why, store.warn)


def _check(store: StoreCore, fix: bool) -> list[str]:
    layout = store.layout
    problems = repair_folders(store, fix)
    if store.access.report.links and not fix:
        return problems  # nothing is walked through a link
    if store.layout.read_format() is None:
        problems.append("FORMAT file missing")
        if fix:
            layout.ensure_format()
    index_problems = store.index.check()
    problems += index_problems
    if fix and index_problems:
        reopen_index(store, f"failed its integrity check ({index_problems[0]})")

    hexes: set[str] = set()
    for hex_ in store.index.row_hexes():
        if HEX_RE.fullmatch(hex_):
            hexes.add(hex_)
            continue
        problems.append(f"index: row {hex_!r} does not name a key")
        if fix:
            store.index.drop_row(hex_)
    hexes |= _check_blobs(store, fix, problems)
    temps: dict[str, list[Path]] = {}
    now = time.time()
    for name, st in scan_folder(layout.tmp):
        path = layout.tmp / name
        m = TEMP_RE.fullmatch(name)
        if m is not None and stat.S_ISREG(st.st_mode):
            temps.setdefault(m["hex"], []).append(path)
            hexes.add(m["hex"])
            continue
        if not stat.S_ISREG(st.st_mode) or now - st.st_mtime > STALE_TEMP_S:
            problems.append(f"stale temp file tmp/{name} ({_kind(st)})")
            if fix:
                remove_path(path)
    for name, st in scan_folder(layout.locks):
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"locks/{name} is {_kind(st)}, not a lock file")
            if fix:
                remove_path(layout.locks / name)

    for hex_ in sorted(hexes):
        # A read-only store takes no locks (it cannot create lock files) and changes nothing.
        with store.try_lock(hex_, held=store.read_only) as got:
            if got:  # else a producer is writing this key right now
                problems += _check_key(store, hex_, temps.get(hex_, []), fix)
    return problems


def _check_blobs(store: StoreCore, fix: bool, problems: list[str]) -> set[str]:
    """Walk blobs/<xx>/ (real folders only); the hexes of well-named payloads and
    sidecars. Anything else is reported and, when fixing, quarantined."""
    layout = store.layout
    hexes: set[str] = set()
    for name, st in scan_folder(layout.blobs):
        path = layout.blobs / name
        if stat.S_ISLNK(st.st_mode):
            continue  # reported (and removed) by repair_folders
        if not stat.S_ISDIR(st.st_mode):
            problems.append(f"unexpected file blobs/{name}")
            if fix:
                store.files.move_to_quarantine(path)
            continue
        for child, cst in scan_folder(path):
            m = PAYLOAD_RE.fullmatch(child) or SIDECAR_RE.fullmatch(child)
            if m is None or m["hex"][:2] != name:
                problems.append(f"unexpected file blobs/{name}/{child}")
                if fix:
                    store.files.move_to_quarantine(path / child)
                continue
            hexes.add(m["hex"])
            if not stat.S_ISREG(cst.st_mode):
                problems.append(f"blobs/{name}/{child} is {_kind(cst)}, not a file")
                if fix:
                    store.files.move_to_quarantine(path / child)
    return hexes


def _check_key(store: StoreCore, hex_: str, temps: list[Path], fix: bool) -> list[str]:
    """Check one key's row, payload, sidecar and temps. Caller holds its lock."""
    problems: list[str] = []
    short = hex_[:12]
    for t in temps:
        problems.append(f"stale temp file tmp/{t.name} from an interrupted write of {short}")
        if fix:
            unlink(t)

    try:
        row = store.row(hex_)
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
            and measured not in (None, NOT_A_FILE)
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
            remove_path(store.layout.sidecar_path(hex_))
    return problems


def gc(store: StoreCore) -> GcReport:
    store.require_writable("collect garbage")
    repaired = _check(store, fix=True)
    evicted, freed = evict_to_limit(store, keep=None)
    live = set(store.index.row_hexes())
    locks_removed = 0
    for name, st in scan_folder(store.layout.locks):
        m = LOCK_RE.fullmatch(name)
        if m is None or m["hex"] in live or not stat.S_ISREG(st.st_mode):
            continue
        lock = KeyLock(store.layout.locks / name)
        if lock.acquire(blocking=False):
            try:
                # Unlinking while holding it: later acquirers notice the inode change
                # and reopen (see KeyLock).
                if m["hex"] not in set(store.index.row_hexes()):
                    locks_removed += unlink(store.layout.locks / name)
            finally:
                lock.release()
    purged = 0
    cutoff = time.time() - QUARANTINE_KEEP_S
    for name, st in scan_folder(store.layout.quarantine):
        if st.st_mtime < cutoff:
            with contextlib.suppress(FileNotFoundError):
                purged += remove_path(store.layout.quarantine / name)
    return GcReport(
        evicted_entries=evicted,
        freed_bytes=freed,
        repaired=tuple(repaired),
        locks_removed=locks_removed,
        quarantine_purged=purged,
        models_removed=models.remove_unused(store.layout.models, time.time() - MODEL_KEEP_S),
    )


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path``, never following links."""
    total = 0
    for name, st in scan_folder(path):
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode):
            total += _tree_bytes(path / name)
    return total


def usage(store: StoreCore) -> StoreUsage:
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


def clear(store: StoreCore) -> int:
    store.require_writable("clear it")
    repair_folders(store, fix=True)
    removed = sum(remove(store, h) for h in store.index.row_hexes())
    layout = store.layout
    for name, st in scan_folder(layout.blobs):
        folder = layout.blobs / name
        if not stat.S_ISDIR(st.st_mode):
            remove_path(folder)  # a stray file or a link: removed, never followed
            continue
        for child, cst in scan_folder(folder):
            m = PAYLOAD_RE.fullmatch(child) or SIDECAR_RE.fullmatch(child)
            if m is None or not stat.S_ISREG(cst.st_mode):
                remove_path(folder / child)
                continue
            with store.try_lock(m["hex"]) as got:
                if got:
                    unlink(folder / child)
    for name, _ in scan_folder(layout.quarantine):
        remove_path(layout.quarantine / name)
    for name, st in scan_folder(layout.locks):
        if name != STORE_LOCK_NAME and not stat.S_ISREG(st.st_mode):
            remove_path(layout.locks / name)
    opening.remove_stale_temps(layout, time.time())
    store.index.reset_counters()
    # Models written into the store and the digest memo are derived data, made again
    # on demand; remove_path never follows a link. A model folder in use is kept
    # (issue 29: clearing it under a generate broke the generate).
    models.clear(layout.models)
    remove_path(layout.digests)
    return removed


def evict_to_limit(store: StoreCore, keep: str | None) -> tuple[int, int]:
    """Evict least-recently-used entries until under the limit.

    Never evicts ``keep`` (the entry just written) nor the last entry left, so
    a single blob over the limit is kept (with a warning). Entries whose lock
    is busy are skipped. Returns (entries evicted, bytes freed); a read-only store
    evicts nothing.
    """
    if store.read_only:
        return 0, 0
    limit = store.size_limit_bytes
    entries = list_entries(store)
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


def remove(store: StoreCore, hex_: str) -> bool:
    """Remove the entry with this full hex under its lock; False if there is none."""
    if not store.index.has_row(hex_):
        return False
    lock = store.key_lock(hex_)
    try:
        lock.acquire(blocking=True, policy=store.lock_policy)
    except LockTimeout as exc:
        raise StoreError(f"blob store {store.root}: cannot remove {hex_[:12]}: {exc}") from exc
    try:
        return store.delete_entry_files(hex_)
    finally:
        lock.release()
