"""Opening a store folder: refuse what is not safe (before anything below the root is
read), migrate what is old, find out whether it can be written, and get an index that
works (a damaged one is rebuilt from the sidecars).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ovspec.errors import StoreError, arg
from ovspec.store.files import EntryFiles, remove_path, unlink
from ovspec.store.index import Index, IndexDamaged, is_damage
from ovspec.store.layout import (
    ENV_ROOT,
    FOLDER_MODE,
    MIGRATABLE_FORMATS,
    SIDECAR_RE,
    STORE_FORMAT_VERSION,
    TEMP_RE,
    StoreLayout,
)
from ovspec.store.locks import KeyLock, LockPolicy, LockTimeout, try_lock
from ovspec.store.records import row_json
from ovspec.store.trust import FolderReport, foreign_message, inspect, links_message

# A temp file whose key lock is free is stale at once; one whose name does not
# say which key it belongs to is stale after this age.
STALE_TEMP_S = 3600.0
# Errors that say "you may read this folder but not write it".
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Access:
    """How a store was opened. ``immutable``: on a read-only filesystem (no locks)."""

    read_only: bool
    immutable: bool
    report: FolderReport
    found_format: int


def not_writable(layout: StoreLayout, exc: OSError) -> StoreError:
    return StoreError(
        f"cache folder {layout.root} is not writable ({exc.strerror or exc}); "
        f"pass {arg('root')} or set {ENV_ROOT}"
    )


def prepare(layout: StoreLayout, *, trust_shared: bool, repair: bool) -> Access:
    """Check, stamp and probe the folder; StoreError when it must not be used. Ownership
    and links are checked (``trust``) before anything below the root is read, and the
    FORMAT stamp before any folder is made."""
    root = layout.root
    if not os.path.lexists(root):
        if trust_shared:
            raise StoreError(f"no store at {root}: there is nothing to use read-only")
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(root, FOLDER_MODE)
        except OSError as exc:
            raise not_writable(layout, exc) from exc
    if not root.is_dir():
        raise StoreError(f"cache folder {root} is not a folder; pass another {arg('root')}")
    report = inspect(layout)
    if report.foreign and not trust_shared:
        raise StoreError(foreign_message(layout, report))
    if report.links and not repair:
        raise StoreError(links_message(layout, report))
    if trust_shared:
        version = layout.read_format()
        if version is None:
            raise StoreError(f"no store at {root} (no FORMAT file); nothing to use read-only")
        if version != STORE_FORMAT_VERSION:
            layout.check_format(version)
            raise StoreError(
                f"cache folder {root} has store format {version}; its owner must open it "
                f"once (without --trust-shared-store) to migrate it to format "
                f"{STORE_FORMAT_VERSION}"
            )
        return Access(True, _on_read_only_fs(layout), report, version)
    read_only = False
    try:
        version = layout.ensure_format()
        layout.make_folders()
        # mkdir of existing folders proves nothing: probe a real write (in the root when
        # tmp/ is a link being repaired: nothing is written through a link).
        where = layout.tmp if "tmp" not in report.bad_paths else layout.root
        fd, probe = tempfile.mkstemp(dir=where, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        found = layout.read_format()
        if exc.errno not in _READ_ONLY_ERRNOS or found is None:
            raise not_writable(layout, exc) from exc
        version, read_only = found, True
    if read_only and version != STORE_FORMAT_VERSION:
        raise StoreError(
            f"cache folder {root} has store format {version} and cannot be written here; "
            f"format {version} is migrated to {STORE_FORMAT_VERSION} on a writable open"
        )
    return Access(read_only, read_only and _on_read_only_fs(layout), report, version)


def _on_read_only_fs(layout: StoreLayout) -> bool:
    try:
        return bool(os.statvfs(layout.root).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextlib.contextmanager
def store_lock(layout: StoreLayout, policy: LockPolicy) -> Iterator[None]:
    """The store-wide lock (index recovery, migration)."""
    lock = KeyLock(layout.store_lock)
    try:
        lock.acquire(blocking=True, policy=policy)
    except LockTimeout as exc:
        raise StoreError(f"blob store {layout.root}: cannot lock the store ({exc})") from exc
    try:
        yield
    finally:
        lock.release()


def rebuild_index(index: Index, layout: StoreLayout) -> int:
    """Add a row for every sidecar whose payload is a file of the size it names.

    Payloads are not hashed here (a store may hold many GB): every lookup verifies
    the bytes it returns, and ``check`` hashes everything. Returns the rows added.
    """
    files = EntryFiles(layout)
    added = 0
    for folder in _real_folders(layout):
        with os.scandir(folder) as it:
            names = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
        for name in names:
            m = SIDECAR_RE.fullmatch(name)
            if m is None or m["hex"][:2] != os.path.basename(folder):
                continue
            try:
                entry = files.read_sidecar(m["hex"])
                st = os.lstat(layout.payload_path(m["hex"]))
            except (ValueError, OSError):
                continue
            if entry is None or not stat.S_ISREG(st.st_mode) or st.st_size != entry.size_bytes:
                continue
            added += index.add_row(entry.hex, row_json(entry))
    return added


def _real_folders(layout: StoreLayout) -> list[str]:
    """blobs/<xx> folders that are folders (never links), sorted."""
    try:
        with os.scandir(layout.blobs) as it:
            return sorted(e.path for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def open_index(
    layout: StoreLayout, access: Access, policy: LockPolicy, warn: Warn, *, usable: bool
) -> Index:
    """The store's index; a damaged one is replaced by one rebuilt from the sidecars.

    ``usable=False`` (the index folder is a link, opened only to be repaired): an
    in-memory index; nothing is read through the link.
    """
    if not usable:
        return Index(None)
    path = layout.index_db
    if access.read_only:
        try:
            return Index(path, read_only=True, immutable=access.immutable)
        except (IndexDamaged, sqlite3.Error) as exc:
            index = Index(None)
            n = rebuild_index(index, layout)
            warn(
                f"the index of read-only store {layout.root} cannot be read ({exc}); "
                f"serving its {n} entries from their sidecars"
            )
            return index
    if access.found_format in MIGRATABLE_FORMATS:
        return _migrate(layout, access.found_format, policy, warn)
    try:
        return Index(path)
    except (IndexDamaged, sqlite3.DatabaseError) as first:
        if not is_damage(first):
            raise
        with store_lock(layout, policy):
            try:
                return Index(path)  # another process may have rebuilt it meanwhile
            except (IndexDamaged, sqlite3.DatabaseError) as exc:
                if not is_damage(exc):
                    raise
                return rebuild(layout, f"was damaged ({exc})", warn)


def rebuild(layout: StoreLayout, why: str, warn: Warn) -> Index:
    """Move the index file aside and rebuild it from the sidecars. Store lock held."""
    files = EntryFiles(layout)
    for name in (layout.index_db.name, f"{layout.index_db.name}-journal"):
        files.move_to_quarantine(layout.index / name)
    index = Index(layout.index_db)
    n = rebuild_index(index, layout)
    warn(
        f"the index of {layout.root} {why}; moved it to quarantine/ and rebuilt it from "
        f"{n} sidecars (statistics and the size limit are reset)"
    )
    return index


def _migrate(layout: StoreLayout, version: int, policy: LockPolicy, warn: Warn) -> Index:
    """Format 1 -> current: its blobs and sidecars are kept; its diskcache index and
    digest memo are deleted without being read (they hold pickles)."""
    with store_lock(layout, policy):
        if layout.read_format() == STORE_FORMAT_VERSION:
            return Index(layout.index_db)  # another process migrated it meanwhile
        for folder in (layout.index, layout.digests):
            remove_path(folder)
        os.mkdir(layout.index, FOLDER_MODE)
        index = Index(layout.index_db)
        n = rebuild_index(index, layout)
        layout.stamp_format()
    warn(
        f"migrated store {layout.root} from format {version} to {STORE_FORMAT_VERSION}: "
        f"its index was deleted unread and rebuilt from {n} sidecars (statistics reset)"
    )
    return index


def remove_stale_temps(layout: StoreLayout, now_unix_s: float) -> int:
    """Delete temps of writers that are gone (their key's lock is free) and unnamed
    temps older than ``STALE_TEMP_S``. Links and folders in tmp/ are removed, never
    followed."""
    removed = 0
    try:
        with os.scandir(layout.tmp) as it:
            found = [(e.name, e.stat(follow_symlinks=False)) for e in it]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for name, st in found:
        path = layout.tmp / name
        m = TEMP_RE.fullmatch(name)
        if m is None or not stat.S_ISREG(st.st_mode):
            if now_unix_s - st.st_mtime > STALE_TEMP_S:
                with contextlib.suppress(FileNotFoundError):
                    removed += remove_path(path)
            continue
        with try_lock(layout.lock_path(m["hex"])) as got:
            if got:
                removed += unlink(path)
    return removed
