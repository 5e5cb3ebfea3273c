"""``Store``, what the rest of ovspec opens: the local folder (``disk.DiskStore``) and, when
given, a remote level behind it (``tier.Tier``). It answers callers' questions (a key's
record, the models folder, a digest memo) without handing out either level's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ovspec.store.core import DEFAULT_SIZE_LIMIT_BYTES
from ovspec.store.digests import DigestMemo
from ovspec.store.disk import DiskStore
from ovspec.store.keys import BlobKey
from ovspec.store.layout import STORE_FORMAT_VERSION, default_root
from ovspec.store.locks import LockPolicy
from ovspec.store.records import (
    BlobOutcome,
    BlobRecord,
    GcReport,
    PayloadWriteError,
    ProducedBlob,
    RemoteStats,
    StoreEntry,
    StoreStats,
    StoreUsage,
    StoreWarning,
)
from ovspec.store.storage import BlobStorage
from ovspec.store.tier import Tier
from ovspec.store.trust import trust_shared_from_env

__all__ = [
    "DEFAULT_SIZE_LIMIT_BYTES",
    "STORE_FORMAT_VERSION",
    "BlobOutcome",
    "BlobRecord",
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
        remote: BlobStorage | None = None,
        strict_remote: bool = False,
    ) -> None:
        """``create=False`` refuses a folder that holds no store yet: read-only commands
        must not make one in a mistyped folder. ``remote``: a shared level behind this
        store (``ovspec.store.tier``): misses fetch from it, compiles upload to it;
        its failures warn and compile unless ``strict_remote``."""
        self.local = DiskStore(
            root,
            strict=strict,
            size_limit_bytes=size_limit_bytes,
            trust_shared=trust_shared_from_env() if trust_shared is None else trust_shared,
            repair=repair,
            lock_policy=lock_policy,
            create=create,
        )
        self.tier = Tier(self.local, remote, strict=strict_remote) if remote is not None else None

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
            self.local.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the store is ------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.local.root

    @property
    def strict(self) -> bool:
        return self.local.strict

    @property
    def read_only(self) -> bool:
        """Nothing is written: a shared store opened with ``trust_shared``, or a folder
        this process cannot write. Lookups still verify; misses compile outside."""
        return self.local.read_only

    @property
    def models_folder(self) -> Path:
        """Where built-in models and GGUF imports are written: this store's models/, or
        for a store that is read-only here, the user's own default store's."""
        return self.local.models_folder

    def wrote_model(self, folder: Path) -> bool:
        """Whether ``folder`` is a model this store wrote into its models/."""
        return self.local.wrote_model(folder)

    def digest_memo(self) -> DigestMemo:
        """A file-digest memo for keys of this store (kept in memory only when the store
        is read-only here)."""
        return self.local.digest_memo()

    @property
    def size_limit_bytes(self) -> int:
        return self.local.size_limit_bytes

    def set_size_limit(self, size_limit_bytes: int) -> None:
        """Persist a new size limit (shared by every process using this root)."""
        self.local.set_size_limit(size_limit_bytes)

    # -- blobs --------------------------------------------------------------------------

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
        With a remote, a local miss is fetched from it (``fetched``) before
        ``produce`` is asked, and a produced blob is uploaded in the background.
        """
        if self.tier is not None:
            return self.tier.get_or_create(key, produce, validate, map_payload)
        return self.local.get_or_create(key, produce, validate=validate, map_payload=map_payload)

    def record(self, key: BlobKey) -> BlobRecord | None:
        """What the store knows of ``key`` without reading its payload: the local entry,
        else the remote's record (a verified manifest); None if neither has one. Not
        verified and not counted: for facts a blob was stored with (its roles, its
        compile time), checked again where they are used."""
        entry = self.local.record(key)
        if entry is None and self.tier is not None:
            return self.tier.record(key)
        return entry

    def peek(self, key: BlobKey) -> bool:
        """Whether ``key`` looks stored locally, without hashing, counting or touching
        anything; ``lookup`` still verifies before anything is used."""
        return self.local.contains(key)

    def lookup(self, key: BlobKey) -> StoreEntry | None:
        """A verified local entry for ``key``, or None (counted); see ``DiskStore.lookup``."""
        return self.local.lookup(key)

    def quarantine(self, hex_: str, checksum: str, why: str) -> bool:
        """Move a stored entry aside because a consumer found it unusable (its bytes
        verify, but the device cannot import them); whether it was moved."""
        return self.local.quarantine(hex_, checksum, why)

    def remove(self, hex_: str) -> bool:
        """Remove the entry with this full hex; False if there is none."""
        return self.local.remove(hex_)

    # -- listing and upkeep -------------------------------------------------------------

    def entries(self) -> list[StoreEntry]:
        """Every well-formed index row, most recently used first (not verified)."""
        return self.local.entries()

    def find(self, prefix: str) -> StoreEntry:
        """The entry whose hex starts with ``prefix``; StoreError if none or several."""
        return self.local.find(prefix)

    def stats(self) -> StoreStats:
        return self.local.stats()

    def usage(self) -> StoreUsage:
        """Bytes on disk under the root, by what holds them (never through a link)."""
        return self.local.usage()

    def check(self, fix: bool = False) -> list[str]:
        """Problems found in index, payloads, sidecars and temps; [] when healthy.

        With ``fix=True`` each problem is also repaired (the list still names what
        was found, as diskcache's ``Cache.check`` does). Keys whose lock is held (a write
        in progress) are skipped. Every payload is hashed: cost ~ bytes stored.
        """
        return self.local.check(fix)

    def gc(self) -> GcReport:
        """Repair what check(fix=True) repairs, evict to the size limit, and drop idle
        lock files, quarantined payloads and model folders older than a week."""
        return self.local.gc()

    def clear(self) -> int:
        """Remove every entry, quarantined file, stale temp, written model and memo;
        reset the counters. Keeps the settings (size limit). Returns the number of
        entries removed."""
        return self.local.clear()
