"""The local level of the store: one folder on this machine, one payload file per key.
Implements ``storage.BlobStorage`` plus what only a local folder offers: reads mapped in
place, a producer run once per key under the key's lock, and upkeep (check, gc, clear).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ovspec.errors import BlobRefusedError, StoreError
from ovspec.store import healing, listing, maintenance, publish
from ovspec.store.core import StoreCore
from ovspec.store.digests import DigestMemo
from ovspec.store.files import unlink, verify
from ovspec.store.index import INDEX_ERRORS, STAT_MISSES
from ovspec.store.keys import BlobKey
from ovspec.store.layout import default_root
from ovspec.store.locks import ENV_LOCK_WAIT_S, LockPolicy, LockTimeout
from ovspec.store.lookup import count_hit, lookup
from ovspec.store.records import (
    BlobOutcome,
    BlobRecord,
    GcReport,
    ProducedBlob,
    StoreEntry,
    StoreStats,
    StoreUsage,
    Verdict,
)
from ovspec.store.storage import PutResult

Producer = Callable[[Path], ProducedBlob]
Validator = Callable[[Path], None]


class DiskStore:
    """The store folder at ``root``; see ``local.Store`` for the options' meaning."""

    def __init__(
        self,
        root: Path | str,
        *,
        strict: bool = False,
        size_limit_bytes: int | None = None,
        trust_shared: bool = False,
        repair: bool = False,
        lock_policy: LockPolicy | None = None,
        create: bool = True,
    ) -> None:
        if size_limit_bytes is not None and size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        self._core = StoreCore(
            root,
            strict=strict,
            trust_shared=trust_shared,
            repair=repair,
            lock_policy=lock_policy,
            create=create,
        )
        if size_limit_bytes is not None:
            self.set_size_limit(size_limit_bytes)

    def close(self) -> None:
        self._core.index.close()

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the folder is -----------------------------------------------------------

    @property
    def root(self) -> Path:
        return self._core.root

    @property
    def location(self) -> str:
        return str(self._core.root)

    @property
    def strict(self) -> bool:
        return self._core.strict

    @property
    def read_only(self) -> bool:
        """Nothing is written: a shared store opened with ``trust_shared``, or a folder
        this process cannot write. Lookups still verify; misses compile outside."""
        return self._core.read_only

    @property
    def models_folder(self) -> Path:
        """Where built-in models go: this store's models/, or for a store that is
        read-only here, the user's own default store's (never into another's store)."""
        own = default_root().expanduser().resolve() / "models"
        layout = self._core.layout
        return layout.models if not self.read_only or own.parent == self.root else own

    def wrote_model(self, folder: Path) -> bool:
        """Whether ``folder`` is a model this store wrote into its models/."""
        return folder.parent == self._core.layout.models

    def digest_memo(self) -> DigestMemo:
        """A file-digest memo kept in this store's digests/; in memory only when the
        store is read-only here (it may be another user's: a planted digest would name
        another file's blobs)."""
        return DigestMemo(None if self.read_only else self._core.layout.digests)

    @property
    def size_limit_bytes(self) -> int:
        return self._core.size_limit_bytes

    def set_size_limit(self, size_limit_bytes: int) -> None:
        """Persist a new size limit (shared by every process using this root)."""
        if size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        with self._core.locked_io("set the size limit"):
            self._core.index.set_size_limit_bytes(size_limit_bytes)

    def count(self, name: str, delta: int = 1) -> None:
        """Add to one of the persistent counters ``stats`` reports (every process's
        count, kept in the index); a counter that cannot be kept fails open."""
        self._core.count(name, delta)

    # -- BlobStorage --------------------------------------------------------------------

    def contains(self, key: BlobKey) -> bool:
        """Whether ``key`` looks stored (a row naming it, a payload of its size), without
        hashing, counting or touching anything; ``lookup`` verifies before any use."""
        return listing.peek(self._core, key)

    def record(self, key: BlobKey) -> StoreEntry | None:
        """The index's entry for ``key`` (not verified, not counted); None if there is
        none, or it is malformed or names another key."""
        try:
            entry = self._core.row(key.hex)
        except ValueError:
            return None
        except INDEX_ERRORS as exc:
            self._core.fail_open(f"cannot read the record of {key.hex[:12]}", exc)
            return None
        return entry if entry is not None and entry.components == key.components else None

    def get(self, key: BlobKey, dest: Path, *, max_bytes: int | None = None) -> StoreEntry | None:
        """Copy the verified payload of ``key`` to ``dest`` (counted as nothing); a corrupt
        one is quarantined and refused."""
        found = self.record(key)
        if found is not None and max_bytes is not None and found.size_bytes > max_bytes:
            raise BlobRefusedError(
                f"blob {key.hex[:12]} is {found.size_bytes} bytes, over the {max_bytes} allowed"
            )
        with self._core.locked_io(f"read blob {key.hex[:12]}"):
            entry, mapping = lookup(self._core, key, held=False, mapped=True, refuse=True)
        if entry is None or mapping is None:
            return None
        try:
            with dest.open("wb") as f:
                f.write(mapping)
        except BaseException:
            unlink(dest)
            raise
        finally:
            mapping.close()
        return entry

    def put(self, key: BlobKey, source: Path, record: BlobRecord) -> PutResult:
        """Copy the payload at ``source`` in under the key's lock, if it hashes to
        ``record.checksum``; a verified entry already there is kept."""
        if record.hex != key.hex or record.components != key.components:
            raise ValueError(f"the record names blob {record.hex[:12]}, not {key.hex[:12]}")
        self._core.require_writable(f"store blob {key.hex[:12]}")
        lock = self._core.key_lock(key.hex)
        try:
            lock.acquire(blocking=True, policy=self._core.lock_policy)
        except LockTimeout as exc:
            raise StoreError(f"blob store {self.root}: cannot lock {key.hex[:12]}: {exc}") from exc
        try:
            with self._core.locked_io(f"store blob {key.hex[:12]}"):
                return publish.put_locked(self._core, key, source, record)
        finally:
            lock.release()

    def remove(self, hex_: str) -> bool:
        """Remove the entry with this full hex; False if there is none."""
        self._core.require_writable("remove an entry")
        with self._core.locked_io("remove an entry"):
            return maintenance.remove(self._core, hex_)

    def hexes(self) -> Iterator[str]:
        with self._core.locked_io("list the entries"):
            return iter(self._core.index.row_hexes())

    def verify(self, key: BlobKey) -> Verdict:
        """Hash the payload of ``key`` against its entry; one that fails is dropped
        (missing) or quarantined (corrupt), as a lookup would."""
        entry = self.record(key)
        if entry is None:
            return Verdict.MISSING
        verdict = verify(entry)
        if verdict is not Verdict.OK:
            with self._core.locked_io(f"set blob {key.hex[:12]} aside"):
                healing.discard_bad(self._core, key.hex, entry, verdict, held=False)
        return verdict

    # -- verified reads and the producer, under the key's lock ------------------------------

    def lookup(self, key: BlobKey) -> StoreEntry | None:
        """A verified entry for ``key``, or None (counted as a hit or a miss).

        The payload is checksummed on every call; a corrupt or missing one is
        quarantined with a ``StoreWarning`` and reported as a miss. The returned
        path stays valid until the entry is evicted or removed (by this or another
        process); to read the bytes that were verified, use ``get_or_create`` with
        ``map_payload=True``, whose mapping outlives an eviction.
        """
        core = self._core
        try:
            entry, _ = lookup(core, key, held=False, mapped=False)
        except INDEX_ERRORS as exc:
            core.fail_open(f"lookup of {key.hex[:12]} failed; treating it as a miss", exc)
            return None
        if entry is None:
            core.count(STAT_MISSES)
        else:
            self._count_hit(entry)
        return entry

    def _count_hit(self, entry: StoreEntry) -> None:
        try:
            count_hit(self._core, entry)
        except INDEX_ERRORS as exc:
            self._core.fail_open("cannot update statistics", exc)

    def quarantine(self, hex_: str, checksum: str, why: str) -> bool:
        """Move a stored entry aside because a consumer found it unusable (its bytes
        verify, but the device cannot import them); see ``healing.quarantine``."""
        return healing.quarantine(self._core, hex_, checksum, why)

    def get_or_create(
        self,
        key: BlobKey,
        produce: Producer,
        *,
        validate: Validator | None = None,
        map_payload: bool = False,
    ) -> BlobOutcome:
        """The stored blob for ``key``, running ``produce`` only if it is missing, once
        across threads and processes (see ``local.Store.get_or_create``)."""
        core, hex_ = self._core, key.hex
        try:
            entry, mapping = lookup(core, key, held=False, mapped=map_payload)
        except INDEX_ERRORS as exc:
            core.fail_open(f"lookup of {hex_[:12]} failed", exc)
            return publish.produce_outside(core, key, produce, validate)
        if entry is not None:
            self._count_hit(entry)
            return BlobOutcome.stored_entry(entry, hit=True, wait_s=0.0, payload=mapping)
        if self.read_only:
            core.fail_open(
                f"is read-only here; blob {hex_[:12]} is compiled outside it",
                PermissionError("not stored"),
            )
            return publish.produce_outside(core, key, produce, validate)

        lock = core.key_lock(hex_)
        wait_s = 0.0
        try:
            if not lock.acquire(blocking=False):
                t0 = time.perf_counter()
                lock.acquire(blocking=True, policy=core.lock_policy)
                wait_s = time.perf_counter() - t0
        except LockTimeout as exc:
            core.fail_open(
                f"gave up waiting for the lock of blob {hex_[:12]}; compiling it outside the "
                f"store, without the lock ({ENV_LOCK_WAIT_S} sets how long to wait)",
                exc,
            )
            return publish.produce_outside(core, key, produce, validate, wait_s=exc.waited_s)
        except OSError as exc:
            core.fail_open(f"cannot lock {hex_[:12]}", exc)
            return publish.produce_outside(core, key, produce, validate)
        try:
            return publish.create_locked(core, key, produce, wait_s, validate)
        finally:
            lock.release()

    # -- listing and upkeep ---------------------------------------------------------------

    def entries(self) -> list[StoreEntry]:
        """Every well-formed index row, most recently used first (not verified)."""
        return listing.entries(self._core)

    def find(self, prefix: str) -> StoreEntry:
        """The entry whose hex starts with ``prefix``; StoreError if none or several."""
        return listing.find(self._core, prefix)

    def stats(self) -> StoreStats:
        return listing.stats(self._core)

    def usage(self) -> StoreUsage:
        """Bytes on disk under the root, by what holds them (never through a link)."""
        with self._core.locked_io("measure the store"):
            return maintenance.usage(self._core)

    def check(self, fix: bool = False) -> list[str]:
        """Problems found in index, payloads, sidecars and temps; [] when healthy (with
        ``fix``, each is also repaired). Keys whose lock is held are skipped."""
        with self._core.locked_io("check the store"):
            return maintenance.check(self._core, fix)

    def evict_to_limit(self, keep: str | None = None) -> tuple[int, int]:
        """Evict least-recently-used entries until under the size limit; returns
        (entries evicted, bytes freed)."""
        with self._core.locked_io("evict entries"):
            return maintenance.evict_to_limit(self._core, keep)

    def gc(self) -> GcReport:
        with self._core.locked_io("collect garbage"):
            return maintenance.gc(self._core)

    def clear(self) -> int:
        with self._core.locked_io("clear the store"):
            return maintenance.clear(self._core)
