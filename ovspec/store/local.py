"""The persistent, content-addressed blob store: one payload file per ``BlobKey``.

Owns reads (verified on every lookup), writes (the per-key lock, produce into a temp
file, commit by rename, fail open outside the store) and the public maintenance
calls. Opening (trust, format, index recovery) is ``opening``'s, the folder layout
``layout``'s, the index ``index``'s, entry files ``files``'s, repairs on the read
path ``healing``'s, the write path ``publish``'s and the self-check, eviction,
garbage collection and clearing ``maintenance``'s. OpenVINO is never imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from ovspec.errors import StoreError, arg
from ovspec.store import healing, listing, maintenance, opening, publish
from ovspec.store.files import EntryFiles, Verdict, map_verified
from ovspec.store.index import (
    INDEX_ERRORS,
    STAT_HITS,
    STAT_MISSES,
    STAT_QUARANTINED,
    STAT_SAVED_US,
)
from ovspec.store.keys import BlobKey
from ovspec.store.layout import ENV_ROOT, STORE_FORMAT_VERSION, StoreLayout, default_root
from ovspec.store.locks import ENV_LOCK_WAIT_S, KeyLock, LockPolicy, LockTimeout, try_lock
from ovspec.store.records import (
    BlobOutcome,
    GcReport,
    PayloadWriteError,
    ProducedBlob,
    RemoteStats,
    StoreEntry,
    StoreStats,
    StoreUsage,
    StoreWarning,
    entry_from_json,
    row_json,
)
from ovspec.store.remote import Remote
from ovspec.store.tier import Tier
from ovspec.store.trust import trust_shared_from_env

__all__ = [
    "DEFAULT_SIZE_LIMIT_BYTES",
    "STORE_FORMAT_VERSION",
    "BlobOutcome",
    "GcReport",
    "LockPolicy",
    "PayloadWriteError",
    "ProducedBlob",
    "RemoteStats",
    "Store",
    "StoreEntry",
    "StoreStats",
    "StoreWarning",
]

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT_BYTES = 20 * 2**30


class Store:
    """A content-addressed store of compiled-model blobs under one root folder.

    Safe to share between threads and between processes on one machine (local
    filesystem). Storage failures fail open: a ``StoreWarning`` and the caller
    still gets a usable blob (or a miss); ``strict=True`` raises ``StoreError``
    instead. A corrupt or missing payload is never returned: it is quarantined,
    warned about and treated as a miss, whatever ``strict`` says.

    A folder another user owns or can write is refused unless ``trust_shared``
    (default: ``$OVSPEC_TRUST_SHARED_STORE``), which opens it read-only: nothing is
    written, payloads are still verified. A store this process cannot write (a
    read-only mount) opens read-only by itself. A link where one of the store's
    folders belongs is refused unless ``repair`` (``check(fix=True)`` replaces it).
    See cache/README.md for what the store promises and what it does not.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        strict: bool = False,
        size_limit_bytes: int | None = None,
        trust_shared: bool | None = None,
        repair: bool = False,
        lock_policy: LockPolicy | None = None,
        create: bool = True,
        remote: Remote | None = None,
        strict_remote: bool = False,
    ) -> None:
        """``create=False`` refuses a folder that holds no store yet: read-only commands
        must not make one in a mistyped folder. ``remote``: a shared tier behind this
        store (``ovspec.store.tier``): misses fetch from it, compiles upload to it;
        its failures warn and compile unless ``strict_remote``."""
        if size_limit_bytes is not None and size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        # The root may be a link the user chose; below it, nothing is followed.
        self.layout = StoreLayout(Path(root).expanduser().resolve())
        if not create and not self.layout.format_file.is_file():
            raise StoreError(
                f"no ovspec store at {self.layout.root}; check {arg('root')}, or build one "
                "with `ovspec build`"
            )
        self._strict = strict
        self._warned: set[str] = set()
        try:
            self.lock_policy = lock_policy or LockPolicy.from_env()
        except ValueError as exc:
            raise StoreError(str(exc)) from exc
        shared = trust_shared_from_env() if trust_shared is None else trust_shared
        self.access = opening.prepare(self.layout, trust_shared=shared, repair=repair)
        self.files = EntryFiles(self.layout)
        try:
            self.index = opening.open_index(
                self.layout,
                self.access,
                self.lock_policy,
                self.warn,
                usable="index" not in self.access.report.bad_paths,
            )
        except INDEX_ERRORS as exc:
            raise StoreError(
                f"cache folder {self.layout.root}: its index cannot be opened ({exc}); "
                f"pass {arg('root')} or set {ENV_ROOT}"
            ) from exc
        if not self.read_only and not self.access.report.links:
            with contextlib.suppress(OSError):  # a leak to clean, not a reason to fail
                opening.remove_stale_temps(self.layout, time.time())
        if size_limit_bytes is not None:
            self.set_size_limit(size_limit_bytes)
        self.tier = Tier(self, remote, strict=strict_remote) if remote is not None else None

    # -- opening -----------------------------------------------------------------

    @staticmethod
    def default_root() -> Path:
        """``$OVSPEC_CACHE_DIR`` if set, else the user cache folder for ovspec."""
        return default_root()

    def close(self) -> None:
        """Finish the remote uploads under way, then close the index."""
        try:
            if self.tier is not None:
                self.tier.close()
        finally:
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
    def read_only(self) -> bool:
        """Nothing is written: a shared store opened with ``trust_shared``, or a folder
        this process cannot write. Lookups still verify; misses compile outside."""
        return self.access.read_only

    @property
    def models_folder(self) -> Path:
        """Where built-in models go: this store's models/, or for a store that is
        read-only here, the user's own default store's (never into another's store)."""
        own = default_root().expanduser().resolve() / "models"
        return self.layout.models if not self.read_only or own.parent == self.root else own

    def require_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(f"blob store {self.root} is read-only here; cannot {what}")

    @property
    def size_limit_bytes(self) -> int:
        return self.index.size_limit_bytes(DEFAULT_SIZE_LIMIT_BYTES)

    def set_size_limit(self, size_limit_bytes: int) -> None:
        """Persist a new size limit (shared by every process using this root)."""
        if size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        with self.locked_io("set the size limit"):
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
        self.warn(message)

    def warn(self, message: str) -> None:
        """One ``StoreWarning`` per distinct message and store object.

        Only a warning, not also a log record at WARNING: with logging unconfigured,
        Python prints both, so every message appeared twice (issue 10).
        """
        message = " ".join(message.split())  # one line, whatever an OS error said
        if message in self._warned:
            return
        self._warned.add(message)
        log.debug("%s", message)
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

    # -- reads -------------------------------------------------------------------

    def peek(self, key: BlobKey) -> bool:
        """Whether ``key`` looks stored, without hashing, counting or touching anything
        (``listing.peek``); ``lookup`` still verifies before anything is used."""
        return listing.peek(self, key)

    def lookup(self, key: BlobKey) -> StoreEntry | None:
        """A verified entry for ``key``, or None (counted as a hit or a miss).

        The payload is checksummed on every call; a corrupt or missing one is
        quarantined with a ``StoreWarning`` and reported as a miss. The returned
        path stays valid until the entry is evicted or removed (by this or another
        process); to read the bytes that were verified, use ``get_or_create`` with
        ``map_payload=True``, whose mapping outlives an eviction.
        """
        try:
            entry, _ = self._lookup(key, held=False, mapped=False)
        except INDEX_ERRORS as exc:
            self.fail_open(f"lookup of {key.hex[:12]} failed; treating it as a miss", exc)
            return None
        if entry is None:
            try:
                self.index.bump(STAT_MISSES)
            except INDEX_ERRORS as exc:
                self.fail_open("cannot update statistics", exc)
        else:
            self._count_hit_open(entry)
        return entry

    def count_hit(self, entry: StoreEntry) -> None:
        self.index.bump(STAT_HITS)
        self.index.bump(STAT_SAVED_US, round(entry.compile_s * 1e6))

    def lookup_locked(
        self, key: BlobKey, *, mapped: bool = False
    ) -> tuple[StoreEntry | None, mmap.mmap | None]:
        """``lookup`` for a caller that holds the key's lock (counts nothing)."""
        return self._lookup(key, held=True, mapped=mapped)

    def _lookup(
        self, key: BlobKey, *, held: bool, mapped: bool
    ) -> tuple[StoreEntry | None, mmap.mmap | None]:
        hex_ = key.hex
        try:
            entry = self.get_row(hex_)
        except ValueError as exc:
            self.warn(f"index row of blob {hex_[:12]} is malformed ({exc}); ignoring it")
            entry = None
        if entry is None:
            entry = healing.reindex(self, key, held=held)
            if entry is None:
                return None, None
        elif entry.components != key.components:
            self.warn(f"index row of blob {hex_[:12]} names another key; ignoring it")
            return None, None
        # Verify the bytes the caller will read: one mapping, hashed, then handed out.
        verdict, mapping = map_verified(entry)
        if verdict is Verdict.OK:
            if not mapped and mapping is not None:
                mapping.close()
                mapping = None
            try:
                accessed = time.time()
                self.index.touch(hex_, accessed)
            except INDEX_ERRORS as exc:
                # A verified hit stays a hit when only its access time cannot be kept
                # (a full disk under the index).
                self.fail_open("cannot record an access time", exc)
                accessed = entry.accessed_unix_s
            return dataclasses.replace(entry, accessed_unix_s=accessed), mapping
        healing.discard_bad(self, hex_, entry, verdict, held=held)
        return None, None

    def quarantine(self, hex_: str, checksum: str, why: str) -> bool:
        """Move a stored entry aside because a consumer found it unusable (its bytes
        verify, but the device cannot import them); see ``healing.quarantine``."""
        return healing.quarantine(self, hex_, checksum, why)

    # -- writes ------------------------------------------------------------------

    def get_or_create(
        self,
        key: BlobKey,
        produce: Callable[[Path], ProducedBlob],
        *,
        validate: Callable[[Path], None] | None = None,
        map_payload: bool = False,
    ) -> BlobOutcome:
        """The stored blob for ``key``, running ``produce`` if (and only if) it is missing.

        ``produce(path)`` writes the payload to ``path`` (an empty temp file on the
        store's filesystem) and reports its compile time and the bytes it wrote.
        ``validate(path)``, if given, runs before the payload is published and raises
        when the payload is unusable (e.g. the device cannot import it): nothing is
        stored then and the exception propagates. Concurrent callers for one key, in
        any threads or processes, run ``produce`` once: the others wait on the key's
        lock (bounded by ``lock_policy``) and then hit. If ``produce`` raises, nothing
        is stored and the exception propagates (a ``PayloadWriteError`` is a storage
        failure: it fails open). If the store cannot be written, the payload is
        returned from a temp folder outside it (``stored=False``; the caller calls
        ``outcome.discard()``), or ``StoreError`` is raised when strict.
        ``map_payload``: a hit carries a mapping of the verified bytes (``payload``).
        With a remote tier, a local miss is fetched from it (``fetched``) before
        ``produce`` is asked, and a produced blob is uploaded in the background.
        """
        if self.tier is not None:
            return self.tier.get_or_create(key, produce, validate, map_payload)
        return self.get_or_create_local(key, produce, validate=validate, map_payload=map_payload)

    def get_or_create_local(
        self,
        key: BlobKey,
        produce: Callable[[Path], ProducedBlob],
        *,
        validate: Callable[[Path], None] | None = None,
        map_payload: bool = False,
    ) -> BlobOutcome:
        """``get_or_create`` on this store alone (the remote tier calls it)."""
        hex_ = key.hex
        try:
            entry, mapping = self._lookup(key, held=False, mapped=map_payload)
        except INDEX_ERRORS as exc:
            self.fail_open(f"lookup of {hex_[:12]} failed", exc)
            return publish.produce_outside(self, key, produce, validate)
        if entry is not None:
            self._count_hit_open(entry)
            return BlobOutcome.stored_entry(entry, hit=True, wait_s=0.0, payload=mapping)
        if self.read_only:
            self.fail_open(
                f"is read-only here; blob {hex_[:12]} is compiled outside it",
                PermissionError("not stored"),
            )
            return publish.produce_outside(self, key, produce, validate)

        lock = self.key_lock(hex_)
        wait_s = 0.0
        try:
            if not lock.acquire(blocking=False):
                t0 = time.perf_counter()
                lock.acquire(blocking=True, policy=self.lock_policy)
                wait_s = time.perf_counter() - t0
        except LockTimeout as exc:
            self.fail_open(
                f"gave up waiting for the lock of blob {hex_[:12]}; compiling it outside the "
                f"store, without the lock ({ENV_LOCK_WAIT_S} sets how long to wait)",
                exc,
            )
            return publish.produce_outside(self, key, produce, validate, wait_s=exc.waited_s)
        except OSError as exc:
            self.fail_open(f"cannot lock {hex_[:12]}", exc)
            return publish.produce_outside(self, key, produce, validate)
        try:
            return publish.create_locked(self, key, produce, wait_s, validate)
        finally:
            lock.release()

    def _count_hit_open(self, entry: StoreEntry) -> None:
        try:
            self.count_hit(entry)
        except INDEX_ERRORS as exc:
            self.fail_open("cannot update statistics", exc)

    # -- eviction and removal ------------------------------------------------------

    def evict_to_limit(self, keep: str | None) -> tuple[int, int]:
        """Evict least-recently-used entries until under the limit (see
        ``maintenance.evict_to_limit``). Returns (entries evicted, bytes freed)."""
        if self.read_only:
            return 0, 0
        return maintenance.evict_to_limit(self, keep)

    def remove(self, hex_: str) -> bool:
        """Remove the entry with this full hex; False if there is none."""
        self.require_writable("remove an entry")
        with self.locked_io("remove an entry"):
            return maintenance.remove(self, hex_)

    @contextlib.contextmanager
    def locked_io(self, what: str) -> Iterator[None]:
        """Maintenance operations surface storage failures as StoreError."""
        try:
            yield
        except INDEX_ERRORS as exc:
            raise StoreError(f"blob store {self.root}: cannot {what} ({exc})") from exc

    # -- listing and statistics --------------------------------------------------------

    def entries(self) -> list[StoreEntry]:
        """Every well-formed index row, most recently used first (not verified)."""
        return listing.entries(self)

    def find(self, prefix: str) -> StoreEntry:
        """The entry whose hex starts with ``prefix``; StoreError if none or several."""
        return listing.find(self, prefix)

    def stats(self) -> StoreStats:
        return listing.stats(self)

    # -- maintenance (see ovspec.store.maintenance) ------------------------------------

    def check(self, fix: bool = False) -> list[str]:
        """Problems found in index, payloads, sidecars and temps; [] when healthy.

        With ``fix=True`` each problem is also repaired (the list still names what
        was found, as diskcache's ``Cache.check`` does). Keys whose lock is held (a write
        in progress) are skipped. Every payload is hashed: cost ~ bytes stored.
        """
        with self.locked_io("check the store"):
            return maintenance.check(self, fix)

    def usage(self) -> StoreUsage:
        """Bytes on disk under the root, by what holds them (never through a link)."""
        with self.locked_io("measure the store"):
            return maintenance.usage(self)

    def gc(self) -> GcReport:
        """Repair what check(fix=True) repairs, evict to the size limit, and drop idle
        lock files and quarantined payloads older than a week."""
        with self.locked_io("collect garbage"):
            return maintenance.gc(self)

    def clear(self) -> int:
        """Remove every entry, quarantined file and stale temp; reset the counters.

        Keeps the settings (size limit). Returns the number of entries removed.
        """
        with self.locked_io("clear the store"):
            return maintenance.clear(self)
