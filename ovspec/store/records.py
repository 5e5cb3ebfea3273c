"""The store's value types and their JSON form: ``BlobRecord`` (what any level knows of
a blob), ``StoreEntry`` (the local store's: index row and sidecar), outcomes and
statistics; ``entry_from_json`` parses either form (malformed: a ``ValueError``).
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ovspec.store.keys import BlobKey, KeyComponent
from ovspec.store.layout import HEX_RE

# Private temp folders (in the system temp folder) for payloads the store cannot keep.
OUTSIDE_PREFIX = "ovspec-"


class StoreWarning(UserWarning):
    """The store met a fault it worked around (corrupt payload, unwritable folder...)."""


class PayloadWriteError(OSError):
    """A producer could not write the payload it was asked for (disk full, file size
    limit, I/O error): a failure of the storage, not of the producer's work. The store
    then fails open (or raises ``StoreError`` when strict); nothing is published."""


@dataclass(frozen=True)
class ProducedBlob:
    """What a producer reports after writing a payload to the path it was given.

    ``size_bytes``: how many bytes the producer wrote, as it counted them. The store
    publishes only a payload of exactly that size (a short file is a failed write that
    went unnoticed); None when the producer does not count.
    """

    compile_s: float
    metadata: Mapping[str, str] = field(default_factory=dict)
    size_bytes: int | None = None
    # The xxh3-128 the payload must have, when the producer knows it (a payload fetched
    # from a remote tier): ``commit`` publishes nothing that hashes otherwise.
    checksum: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compile_s) and self.compile_s >= 0):
            raise ValueError(f"compile_s must be a finite number >= 0, got {self.compile_s!r}")
        if self.size_bytes is not None and (
            isinstance(self.size_bytes, bool) or self.size_bytes < 0
        ):
            raise ValueError(f"size_bytes must be an int >= 0, got {self.size_bytes!r}")
        for k, v in self.metadata.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise ValueError(f"producer metadata must map str to str, got {k!r}: {v!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))


class Verdict(Enum):
    """What checking a stored payload against its record found."""

    OK = "ok"
    MISSING = "missing"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class BlobRecord:
    """What a level of the store knows of one blob: its key, its payload's size and
    xxh3-128, what compiling it cost, and what its producer noted."""

    hex: str
    components: tuple[KeyComponent, ...]
    size_bytes: int
    checksum: str
    compile_s: float
    metadata: Mapping[str, str]

    def __post_init__(self) -> None:
        if not HEX_RE.fullmatch(self.hex):
            raise ValueError(f"entry hex must be 32 lowercase hex digits, got {self.hex!r}")
        if self.size_bytes < 0:
            raise ValueError(f"entry {self.hex[:12]} has size_bytes {self.size_bytes} < 0")
        if not (math.isfinite(self.compile_s) and self.compile_s >= 0):
            raise ValueError(f"entry {self.hex[:12]} has compile_s {self.compile_s!r}")

    def values(self) -> dict[str, str]:
        """The key components as name -> value (what ``keys.explain`` takes)."""
        return {c.name: c.value for c in self.components}


@dataclass(frozen=True)
class StoreEntry(BlobRecord):
    """One blob in the local store: its record, where its payload is, and when it was
    stored and last used."""

    path: Path
    created_unix_s: float
    accessed_unix_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "hex": self.hex,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "checksum": self.checksum,
            "created_unix_s": self.created_unix_s,
            "accessed_unix_s": self.accessed_unix_s,
            "compile_s": self.compile_s,
            "components": self.values(),
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class BlobOutcome:
    """The answer of ``get_or_create``.

    ``compile_s`` is the compile time recorded for this blob (on a hit: the time
    the hit saved). ``wait_s`` is the time spent waiting for another producer of
    the same key. ``stored`` is False when the store could not be written and the
    payload sits in a private temp folder outside the store: the caller owns it
    and removes it with ``discard()`` when done. ``payload``: when asked for, a
    copy-on-write mapping of the verified bytes (read from it, not from ``path``:
    another process may evict the entry at any time, the mapping stays valid).
    """

    path: Path
    hex: str
    hit: bool
    stored: bool
    compile_s: float
    wait_s: float
    size_bytes: int
    metadata: Mapping[str, str]
    payload: mmap.mmap | None = field(default=None, compare=False, repr=False)
    checksum: str | None = None  # of a stored entry (None: not stored)
    # The payload came from the remote tier in this call (a local miss it served):
    # ``compile_s`` is then the compile the fetch saved, ``fetch_s`` what it took.
    fetched: bool = False
    fetch_s: float = 0.0

    @classmethod
    def stored_entry(
        cls, entry: StoreEntry, *, hit: bool, wait_s: float, payload: mmap.mmap | None = None
    ) -> BlobOutcome:
        """The outcome that hands out a stored entry."""
        return cls(
            path=entry.path,
            hex=entry.hex,
            hit=hit,
            stored=True,
            compile_s=entry.compile_s,
            wait_s=wait_s,
            size_bytes=entry.size_bytes,
            metadata=entry.metadata,
            payload=payload,
            checksum=entry.checksum,
        )

    def discard(self) -> None:
        """Remove a payload the store did not keep, and its private folder."""
        if self.stored:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        folder = self.path.parent
        if folder.name.startswith(OUTSIDE_PREFIX):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty; never a folder of the store


@dataclass(frozen=True)
class RemoteStats:
    """What this store moved through a remote tier (counted locally, across processes)."""

    hits: int = 0  # local misses the remote served
    misses: int = 0  # local misses the remote did not have
    refused: int = 0  # blobs refused: a bad manifest, payload or signature, or no import
    failures: int = 0  # times the remote could not be reached (then not asked again)
    fetched_bytes: int = 0
    fetch_s: float = 0.0
    saved_compile_s: float = 0.0  # the compiles the fetches replaced (their recorded time)
    uploads: int = 0  # manifests this store published
    uploaded_bytes: int = 0
    upload_s: float = 0.0

    @property
    def saved_s(self) -> float:
        """Compile seconds saved, net of the time the fetches took."""
        return self.saved_compile_s - self.fetch_s

    @property
    def fetch_bytes_per_s(self) -> float | None:
        """The measured fetch bandwidth (None before the first fetch)."""
        return self.fetched_bytes / self.fetch_s if self.fetch_s > 0 else None

    def to_json(self) -> dict[str, object]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "refused": self.refused,
            "failures": self.failures,
            "fetched_bytes": self.fetched_bytes,
            "fetch_s": self.fetch_s,
            "fetch_bytes_per_s": self.fetch_bytes_per_s,
            "saved_compile_s": self.saved_compile_s,
            "saved_s": self.saved_s,
            "uploads": self.uploads,
            "uploaded_bytes": self.uploaded_bytes,
            "upload_s": self.upload_s,
        }


@dataclass(frozen=True)
class StoreStats:
    """Counters persisted across processes, plus what the index holds now."""

    hits: int
    misses: int
    saved_s: float
    entries: int
    stored_bytes: int
    size_limit_bytes: int
    evictions: int
    quarantined: int
    remote: RemoteStats = field(default_factory=RemoteStats)

    def to_json(self) -> dict[str, object]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "saved_s": self.saved_s,
            "entries": self.entries,
            "stored_bytes": self.stored_bytes,
            "size_limit_bytes": self.size_limit_bytes,
            "evictions": self.evictions,
            "quarantined": self.quarantined,
            "remote": self.remote.to_json(),
        }


@dataclass(frozen=True)
class StoreUsage:
    """Bytes on disk under a store's root, by what holds them."""

    blobs_bytes: int  # payloads and sidecars
    models_bytes: int  # models written into the store (built-in presets, GGUF imports)
    index_bytes: int  # the index and the file-digest memo
    other_bytes: int  # quarantine, temps, locks, FORMAT

    @property
    def total_bytes(self) -> int:
        return self.blobs_bytes + self.models_bytes + self.index_bytes + self.other_bytes

    def to_json(self) -> dict[str, int]:
        return {
            "blobs_bytes": self.blobs_bytes,
            "models_bytes": self.models_bytes,
            "index_bytes": self.index_bytes,
            "other_bytes": self.other_bytes,
            "total_bytes": self.total_bytes,
        }


@dataclass(frozen=True)
class GcReport:
    """What ``gc`` did: LRU evictions, and the repairs of the self-check it ran."""

    evicted_entries: int
    freed_bytes: int
    repaired: tuple[str, ...]
    locks_removed: int
    quarantine_purged: int
    models_removed: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "evicted_entries": self.evicted_entries,
            "freed_bytes": self.freed_bytes,
            "repaired": list(self.repaired),
            "locks_removed": self.locks_removed,
            "quarantine_purged": self.quarantine_purged,
            "models_removed": self.models_removed,
        }


def components_match_hex(components: tuple[KeyComponent, ...], hex_: str) -> bool:
    try:
        return BlobKey(components).hex == hex_
    except ValueError:
        # A key layout this version does not know: the hex cannot be recomputed;
        # the payload checksum still guards the bytes.
        return True


def _want(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"field {name!r} is {value!r}")
    return value


def entry_from_json(obj: object, path: Path) -> StoreEntry:
    """Parse an index row or a sidecar; raises ValueError when malformed."""
    if not isinstance(obj, dict):
        raise ValueError(f"record is a {type(obj).__name__}, not an object")
    raw_components = _want(obj, "components", list)
    raw_metadata = _want(obj, "metadata", dict)
    try:
        components = tuple(KeyComponent(str(n), str(v)) for n, v in raw_components)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"field 'components' is malformed: {exc}") from exc
    created = float(_want(obj, "created_unix_s", (int, float)))
    accessed = obj.get("accessed_unix_s", created)
    if not isinstance(accessed, (int, float)):
        raise ValueError(f"field 'accessed_unix_s' is {accessed!r}")
    return StoreEntry(
        hex=_want(obj, "hex", str),
        path=path,
        size_bytes=_want(obj, "size_bytes", int),
        checksum=_want(obj, "checksum", str),
        created_unix_s=created,
        accessed_unix_s=float(accessed),
        compile_s=float(_want(obj, "compile_s", (int, float))),
        components=components,
        metadata={str(k): str(v) for k, v in raw_metadata.items()},
    )


def record_json(entry: StoreEntry) -> dict[str, Any]:
    """The immutable part of an entry: what the sidecar holds and the row repeats."""
    return {
        "hex": entry.hex,
        "size_bytes": entry.size_bytes,
        "checksum": entry.checksum,
        "created_unix_s": entry.created_unix_s,
        "compile_s": entry.compile_s,
        "components": [[c.name, c.value] for c in entry.components],
        "metadata": dict(entry.metadata),
    }


def row_json(entry: StoreEntry) -> dict[str, Any]:
    return {**record_json(entry), "accessed_unix_s": entry.accessed_unix_s}
