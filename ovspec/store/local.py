"""The persistent, content-addressed blob store: one payload file per ``BlobKey``.

Owns reads (verified on every lookup, self-healing from sidecars), writes (the
per-key lock, produce into a temp file, commit by rename, fail open outside the
store), LRU eviction and the public maintenance calls. The folder layout is
``layout``'s, the index ``index``'s, entry files ``files``'s and the self-check,
garbage collection and clearing ``maintenance``'s. OpenVINO is never imported here.

Compared with OpenVINO's own CACHE_DIR: 128-bit named-component keys, atomic
temp+fsync+rename writes, a cross-process lock per key, LRU eviction under a size
limit, an xxh3-128 checksum verified on every read, and statistics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from ovspec.errors import StoreError, arg
from ovspec.store import maintenance, publish
from ovspec.store.files import EntryFiles, Verdict, verify
from ovspec.store.index import (
    INDEX_ERRORS,
    STAT_EVICTIONS,
    STAT_HITS,
    STAT_MISSES,
    STAT_QUARANTINED,
    STAT_SAVED_US,
    Index,
)
from ovspec.store.keys import BlobKey
from ovspec.store.layout import (
    ENV_ROOT,
    STORE_FORMAT_VERSION,
    StoreLayout,
    default_root,
)
from ovspec.store.locks import KeyLock, try_lock
from ovspec.store.records import (
    BlobOutcome,
    GcReport,
    ProducedBlob,
    StoreEntry,
    StoreStats,
    StoreUsage,
    StoreWarning,
    entry_from_json,
    row_json,
)

__all__ = [
    "DEFAULT_SIZE_LIMIT_BYTES",
    "STORE_FORMAT_VERSION",
    "BlobOutcome",
    "GcReport",
    "ProducedBlob",
    "Store",
    "StoreEntry",
    "StoreStats",
    "StoreWarning",
]

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT_BYTES = 20 * 2**30

# Failures of the storage itself (as opposed to bugs): these fail open unless strict.
_IO_ERRORS = INDEX_ERRORS


class Store:
    """A content-addressed store of compiled-model blobs under one root folder.

    Safe to share between threads and between processes on one machine (local
    filesystem). Storage failures fail open: a ``StoreWarning`` and the caller
    still gets a usable blob (or a miss); ``strict=True`` raises ``StoreError``
    instead. A corrupt or missing payload is never returned: it is quarantined,
    warned about and treated as a miss, whatever ``strict`` says.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        strict: bool = False,
        size_limit_bytes: int | None = None,
        create: bool = True,
    ) -> None:
        """Open the store at ``root``; ``create=False`` refuses a folder that holds no
        store yet (read-only commands must not make one in a mistyped folder)."""
        if size_limit_bytes is not None and size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        self.layout = StoreLayout(Path(root).expanduser().absolute())
        self._strict = strict
        layout = self.layout
        if not create and not layout.format_file.is_file():
            raise StoreError(
                f"no ovspec store at {layout.root}; check {arg('root')}, or build one with "
                "`ovspec build`"
            )
        try:
            layout.root.mkdir(parents=True, exist_ok=True)
            layout.ensure_format()
            for d in (layout.blobs, layout.tmp, layout.quarantine, layout.locks):
                d.mkdir(exist_ok=True)
            # mkdir of existing folders proves nothing: probe a real write.
            fd, probe = tempfile.mkstemp(dir=layout.tmp, prefix="probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreError(
                f"cache folder {layout.root} is not writable ({exc.strerror or exc}); "
                f"pass {arg('root')} or set {ENV_ROOT}"
            ) from exc
        try:
            self.index = Index(str(layout.index))
        except _IO_ERRORS as exc:
            raise StoreError(
                f"cache folder {layout.root}: its index cannot be opened ({exc}); "
                f"pass {arg('root')} or set {ENV_ROOT}"
            ) from exc
        self.files = EntryFiles(layout)
        if size_limit_bytes is not None:
            self.set_size_limit(size_limit_bytes)

    # -- opening -----------------------------------------------------------------

    @staticmethod
    def default_root() -> Path:
        """``$OVSPEC_CACHE_DIR`` if set, else the user cache folder for ovspec."""
        return default_root()

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def strict(self) -> bool:
        return self._strict

    @property
    def size_limit_bytes(self) -> int:
        return self.index.size_limit_bytes(DEFAULT_SIZE_LIMIT_BYTES)

    def set_size_limit(self, size_limit_bytes: int) -> None:
        """Persist a new size limit (shared by every process using this root)."""
        if size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        self.index.set_size_limit_bytes(size_limit_bytes)

    # -- small helpers shared with maintenance -------------------------------------------

    def key_lock(self, hex_: str) -> KeyLock:
        return KeyLock(self.layout.lock_path(hex_))

    def try_lock(self, hex_: str, *, held: bool = False) -> contextlib.AbstractContextManager[bool]:
        """Whether this caller may change ``hex_``'s files now (non-blocking)."""
        return try_lock(self.layout.lock_path(hex_), held=held)

    def fail_open(self, what: str, exc: BaseException) -> None:
        """Storage failure: raise when strict, else warn and let the caller go on."""
        message = f"blob store {self.root}: {what} ({exc})"
        if self._strict:
            raise StoreError(message) from exc
        log.warning("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=3)

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=3)

    def get_row(self, hex_: str) -> StoreEntry | None:
        """The index row of ``hex_``; None if absent. ValueError if malformed."""
        row = self.index.get_row(hex_)
        if row is None:
            return None
        entry = entry_from_json(row, self.layout.payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"row names hex {entry.hex}")
        return entry

    def set_row(self, entry: StoreEntry) -> None:
        self.index.set_row(entry.hex, row_json(entry))

    def quarantine_entry(self, hex_: str) -> None:
        """Move payload and sidecar aside and drop the row. Caller holds the lock."""
        moved = self.files.quarantine_payload_and_sidecar(hex_)
        self.index.drop_row(hex_)
        if moved:
            self.index.bump(STAT_QUARANTINED)

    def delete_entry_files(self, hex_: str) -> bool:
        """Drop the row, then the payload, then the sidecar. Caller holds the lock.

        Row first: a crash in between leaves payload+sidecar, which lookup or
        check(fix=True) re-index, never a row pointing at nothing. Returns whether
        there was a row (False: another process removed it first).
        """
        had_row = self.index.drop_row(hex_)
        self.files.delete_payload_and_sidecar(hex_)
        return had_row

    def _touch(self, hex_: str) -> float:
        now = time.time()
        self.index.touch(hex_, now)
        return now

    # -- reads -------------------------------------------------------------------

    def peek(self, key: BlobKey) -> bool:
        """Whether ``key`` looks stored (a row naming it and a payload of its size), without
        hashing, counting or touching anything: a cheap "would this hit?". ``lookup``
        still verifies before anything is used."""
        try:
            entry = self.get_row(key.hex)
        except (ValueError, *_IO_ERRORS):  # type: ignore[misc]
            return False
        if entry is None or entry.components != key.components:
            return False
        try:
            return entry.path.stat().st_size == entry.size_bytes
        except OSError:
            return False

    def lookup(self, key: BlobKey) -> StoreEntry | None:
        """A verified entry for ``key``, or None (counted as a hit or a miss).

        The payload is checksummed on every call; a corrupt or missing one is
        quarantined with a ``StoreWarning`` and reported as a miss. The returned
        path stays valid until the entry is evicted or removed (by this or another
        process); import it promptly, or copy it, rather than keep the path around.
        """
        try:
            entry = self._lookup(key, held=False)
            if entry is None:
                self.index.bump(STAT_MISSES)
            else:
                self.count_hit(entry)
        except _IO_ERRORS as exc:
            self.fail_open(f"lookup of {key.hex[:12]} failed; treating it as a miss", exc)
            return None
        return entry

    def count_hit(self, entry: StoreEntry) -> None:
        self.index.bump(STAT_HITS)
        self.index.bump(STAT_SAVED_US, round(entry.compile_s * 1e6))

    def lookup_locked(self, key: BlobKey) -> StoreEntry | None:
        """``lookup`` for a caller that holds the key's lock (counts nothing)."""
        return self._lookup(key, held=True)

    def _lookup(self, key: BlobKey, *, held: bool) -> StoreEntry | None:
        hex_ = key.hex
        try:
            entry = self.get_row(hex_)
        except ValueError as exc:
            self.warn(f"index row of blob {hex_[:12]} is malformed ({exc}); ignoring it")
            entry = None
        if entry is not None:
            if entry.components != key.components:
                self.warn(f"index row of blob {hex_[:12]} names another key; ignoring it")
                return None
            verdict = verify(entry)
            if verdict is Verdict.OK:
                return dataclasses.replace(entry, accessed_unix_s=self._touch(hex_))
            self._discard_bad(hex_, verdict, held=held)
            return None
        return self._heal(key, held=held)

    def _discard_bad(self, hex_: str, verdict: Verdict, *, held: bool) -> None:
        if verdict is Verdict.MISSING:
            what = "missing its payload; dropped the entry"
        else:
            what = "corrupt (size or checksum mismatch); quarantined it"
        self.warn(f"blob {hex_[:12]} in {self.root} is {what}; it will be rebuilt")
        with self.try_lock(hex_, held=held) as got:
            if not got:
                return  # another process is rebuilding this key right now
            # Re-verify under the lock: a producer may have replaced it meanwhile.
            try:
                entry = self.get_row(hex_)
            except ValueError:
                entry = None
            if entry is not None and verify(entry) is Verdict.OK:
                return
            if verdict is Verdict.MISSING:
                self.delete_entry_files(hex_)
            else:
                self.quarantine_entry(hex_)

    def _heal(self, key: BlobKey, *, held: bool) -> StoreEntry | None:
        """No index row: re-index payload + sidecar if they verify (self-heal)."""
        hex_ = key.hex
        if not self.layout.payload_path(hex_).exists():
            return None
        try:
            sidecar = self.files.read_sidecar(hex_)
        except ValueError:
            return None  # check(fix=True) quarantines it; a producer overwrites it
        if sidecar is None or sidecar.components != key.components:
            return None  # no sidecar yet: possibly a write in progress
        with self.try_lock(hex_, held=held) as got:
            if not got or verify(sidecar) is not Verdict.OK:
                return None
            entry = dataclasses.replace(sidecar, accessed_unix_s=time.time())
            self.index.add_row(hex_, row_json(entry))
            log.warning("re-indexed blob %s from its sidecar", hex_[:12])
            return entry

    # -- writes ------------------------------------------------------------------

    def get_or_create(self, key: BlobKey, produce: Callable[[Path], ProducedBlob]) -> BlobOutcome:
        """The stored blob for ``key``, running ``produce`` if (and only if) it is missing.

        ``produce(path)`` writes the payload to ``path`` (an empty temp file on the
        store's filesystem) and reports its compile time. Concurrent callers for one
        key, in any threads or processes, run ``produce`` once: the others wait on
        the key's lock and then hit. If ``produce`` raises, nothing is stored and
        the exception propagates. If the store cannot be written, the payload is
        returned from a temp folder outside it (``stored=False``), or ``StoreError``
        is raised when strict. A producer that hangs keeps the others waiting: the
        lock has no timeout (a killed producer releases it at once).
        """
        hex_ = key.hex
        try:
            entry = self._lookup(key, held=False)
        except _IO_ERRORS as exc:
            self.fail_open(f"lookup of {hex_[:12]} failed", exc)
            return publish.produce_outside(self, key, produce)
        if entry is not None:
            self._count_hit_open(entry)
            return self.outcome(entry, hit=True, wait_s=0.0)

        lock = self.key_lock(hex_)
        wait_s = 0.0
        try:
            if not lock.acquire(blocking=False):
                t0 = time.perf_counter()
                lock.acquire(blocking=True)
                wait_s = time.perf_counter() - t0
        except OSError as exc:
            self.fail_open(f"cannot lock {hex_[:12]}", exc)
            return publish.produce_outside(self, key, produce)
        try:
            return publish.create_locked(self, key, produce, wait_s)
        finally:
            lock.release()

    def _count_hit_open(self, entry: StoreEntry) -> None:
        try:
            self.count_hit(entry)
        except _IO_ERRORS as exc:
            self.fail_open("cannot update statistics", exc)

    def outcome(self, entry: StoreEntry, *, hit: bool, wait_s: float) -> BlobOutcome:
        return BlobOutcome(
            path=entry.path,
            hex=entry.hex,
            hit=hit,
            stored=True,
            compile_s=entry.compile_s,
            wait_s=wait_s,
            size_bytes=entry.size_bytes,
            metadata=entry.metadata,
        )

    # -- eviction and removal ------------------------------------------------------

    def evict_to_limit(self, keep: str | None) -> tuple[int, int]:
        """Evict least-recently-used entries until under the limit, never ``keep`` nor
        the last entry; (entries evicted, bytes freed). See ``maintenance.evict``."""
        return maintenance.evict(self, keep)

    def remove(self, hex_: str) -> bool:
        """Remove the entry with this full hex; False if there is none."""
        with self.locked_io("remove an entry"):
            if not self.index.has_row(hex_):
                return False
            lock = self.key_lock(hex_)
            lock.acquire(blocking=True)
            try:
                return self.delete_entry_files(hex_)
            finally:
                lock.release()

    @contextlib.contextmanager
    def locked_io(self, what: str) -> Iterator[None]:
        """Maintenance operations surface storage failures as StoreError."""
        try:
            yield
        except _IO_ERRORS as exc:
            raise StoreError(f"blob store {self.root}: cannot {what} ({exc})") from exc

    # -- listing and statistics --------------------------------------------------------

    def entries(self) -> list[StoreEntry]:
        """Every well-formed index row, most recently used first (not verified)."""
        out: list[StoreEntry] = []
        for hex_ in self.index.row_hexes():
            try:
                entry = self.get_row(hex_)
            except ValueError:
                continue  # check() reports it
            if entry is not None:
                out.append(entry)
        out.sort(key=lambda e: (e.accessed_unix_s, e.created_unix_s), reverse=True)
        return out

    def find(self, prefix: str) -> StoreEntry:
        """The entry whose hex starts with ``prefix``; StoreError if none or several."""
        needle = prefix.strip().lower()
        if not needle:
            raise StoreError("empty key prefix; give the first hex digits of an entry")
        matches = [e for e in self.entries() if e.hex.startswith(needle)]
        if not matches:
            raise StoreError(f"no entry matches {prefix!r}; see `ovspec cache ls`")
        if len(matches) > 1:
            shown = ", ".join(e.hex[:12] for e in matches[:4])
            raise StoreError(
                f"prefix {prefix!r} is ambiguous: it matches {len(matches)} entries "
                f"({shown}); give more digits"
            )
        return matches[0]

    def stats(self) -> StoreStats:
        with self.locked_io("read statistics"):
            entries = self.entries()
            counter = self.index.counter
            return StoreStats(
                hits=counter(STAT_HITS),
                misses=counter(STAT_MISSES),
                saved_s=counter(STAT_SAVED_US) / 1e6,
                entries=len(entries),
                stored_bytes=sum(e.size_bytes for e in entries),
                size_limit_bytes=self.size_limit_bytes,
                evictions=counter(STAT_EVICTIONS),
                quarantined=counter(STAT_QUARANTINED),
            )

    # -- maintenance (see ovspec.store.maintenance) ------------------------------------

    def check(self, fix: bool = False) -> list[str]:
        """Problems found in index, payloads, sidecars and temps; [] when healthy.

        With ``fix=True`` each problem is also repaired (the list still names what
        was found, like ``diskcache.Cache.check``). Keys whose lock is held (a write
        in progress) are skipped. Every payload is hashed: cost ~ bytes stored.
        """
        with self.locked_io("check the store"):
            return maintenance.check(self, fix)

    def gc(self) -> GcReport:
        """Repair what check(fix=True) repairs, evict to the size limit, and drop idle
        lock files, quarantined payloads older than a week, and model folders no
        built-in preset of this ovspec names any more (or half-written ones)."""
        with self.locked_io("collect garbage"):
            return maintenance.gc(self)

    def clear(self) -> int:
        """Remove every entry, quarantined file, stale temp, written model and the
        digest memo; reset the counters.

        Keeps the settings (size limit). Returns the number of entries removed.
        """
        with self.locked_io("clear the store"):
            return maintenance.clear(self)

    def usage(self) -> StoreUsage:
        """Bytes on disk under the root, by what holds them (files are not followed
        through symlinks)."""
        with self.locked_io("measure the store"):
            return maintenance.usage(self)
