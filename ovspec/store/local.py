"""The persistent, content-addressed blob store: one payload file per ``BlobKey``.

Owns the on-disk layout, atomic writes, a checksum on every read, the per-key
cross-process lock, LRU eviction, persistent statistics and the self-check
(``check``). Payloads are opaque files; OpenVINO is never imported here.

Layout under the root folder (store format 1)::

    FORMAT                      "ovspec-store 1"
    index/                      diskcache Cache: rows "entry:<hex>", counters "stat:*",
                                settings "setting:*"
    blobs/<hex[:2]>/<hex>.blob  the payload, written by the producer
    blobs/<hex[:2]>/<hex>.json  its sidecar: key components, checksum, size, created
                                time, producer metadata (rebuilds a lost index row)
    tmp/                        in-progress writes: <hex>.<pid>.<token>.{blob,json}.part
    quarantine/                 payloads that failed verification, kept for a post-mortem
    locks/<hex>.lock            per-key flock files

Compared with OpenVINO's own CACHE_DIR: 128-bit named-component keys, atomic
temp+fsync+rename writes, a cross-process lock per key, LRU eviction under a size
limit, an xxh3-128 checksum verified on every read, and statistics.

Locks use ``fcntl.flock``, which needs a local filesystem (it is unreliable over
NFS, and so is SQLite's WAL mode under the index). The kernel drops a flock when
its holder dies, so a killed producer never wedges a key. flock locks belong to an
open file description, so two threads of one process exclude each other as long as
each opens the lock file itself, which ``_KeyLock`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import math
import os
import re
import secrets
import shutil
import sqlite3
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import diskcache
import platformdirs

from ovspec.errors import StoreError
from ovspec.store.digests import size_and_digest
from ovspec.store.keys import BlobKey, KeyComponent

log = logging.getLogger(__name__)

# History: 1 — first layout (2026-11): diskcache index, blobs/<hex[:2]>/ with JSON
# sidecars, tmp/, quarantine/, locks/.
STORE_FORMAT_VERSION = 1
_FORMAT_MAGIC = "ovspec-store"

DEFAULT_SIZE_LIMIT_BYTES = 20 * 2**30
# A temp file whose key lock is free is stale at once; one whose name does not
# say which key it belongs to is stale after this age.
STALE_TEMP_S = 3600.0
# gc() deletes quarantined payloads older than this.
QUARANTINE_KEEP_S = 7 * 24 * 3600.0

_ENV_ROOT = "OVSPEC_CACHE_DIR"
_ROW_PREFIX = "entry:"
_SIZE_LIMIT_SETTING = "setting:size_limit_bytes"
_STAT_HITS = "stat:hits"
_STAT_MISSES = "stat:misses"
_STAT_SAVED_US = "stat:saved_us"  # integer microseconds: diskcache.incr is exact on ints
_STAT_EVICTIONS = "stat:evictions"
_STAT_QUARANTINED = "stat:quarantined"
_COUNTERS = (_STAT_HITS, _STAT_MISSES, _STAT_SAVED_US, _STAT_EVICTIONS, _STAT_QUARANTINED)

_HEX_RE = re.compile(r"[0-9a-f]{32}")
_PAYLOAD_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.blob")
_SIDECAR_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.json")
_TEMP_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.\d+\.[0-9a-f]+\.(blob|json)\.part")
_LOCK_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.lock")
# models/ (built-in models) and digests/ (file-digest memo) belong to ovspec, not the index.
_ROOT_NAMES = frozenset(
    {"FORMAT", "index", "blobs", "tmp", "quarantine", "locks", "models", "digests"}
)

# Failures of the storage itself (as opposed to bugs): these fail open unless strict.
_IO_ERRORS: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, diskcache.Timeout)


class StoreWarning(UserWarning):
    """The store met a fault it worked around (corrupt payload, unwritable folder...)."""


@dataclass(frozen=True)
class ProducedBlob:
    """What a producer reports after writing a payload to the path it was given."""

    compile_s: float
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compile_s) and self.compile_s >= 0):
            raise ValueError(f"compile_s must be a finite number >= 0, got {self.compile_s!r}")
        for k, v in self.metadata.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise ValueError(f"producer metadata must map str to str, got {k!r}: {v!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))


@dataclass(frozen=True)
class StoreEntry:
    """One stored blob: where it is, what it weighs, what made it."""

    hex: str
    path: Path
    size_bytes: int
    checksum: str
    created_unix_s: float
    accessed_unix_s: float
    compile_s: float
    components: tuple[KeyComponent, ...]
    metadata: Mapping[str, str]

    def __post_init__(self) -> None:
        if not _HEX_RE.fullmatch(self.hex):
            raise ValueError(f"entry hex must be 32 lowercase hex digits, got {self.hex!r}")
        if self.size_bytes < 0:
            raise ValueError(f"entry {self.hex[:12]} has size_bytes {self.size_bytes} < 0")
        if not (math.isfinite(self.compile_s) and self.compile_s >= 0):
            raise ValueError(f"entry {self.hex[:12]} has compile_s {self.compile_s!r}")

    def values(self) -> dict[str, str]:
        """The key components as name -> value (what ``keys.explain`` takes)."""
        return {c.name: c.value for c in self.components}

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
    and should delete it when done.
    """

    path: Path
    hex: str
    hit: bool
    stored: bool
    compile_s: float
    wait_s: float
    size_bytes: int
    metadata: Mapping[str, str]


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
        }


@dataclass(frozen=True)
class GcReport:
    """What ``gc`` did: LRU evictions, and the repairs of the self-check it ran."""

    evicted_entries: int
    freed_bytes: int
    repaired: tuple[str, ...]
    locks_removed: int
    quarantine_purged: int


class _Verdict(Enum):
    OK = "ok"
    MISSING = "missing"
    CORRUPT = "corrupt"


class _KeyLock:
    """An exclusive ``flock`` on ``locks/<hex>.lock``; one fd per acquisition.

    gc() may unlink an idle lock file while holding it, so after locking we check
    that the path still names the inode we locked, and retry otherwise (the
    classic flock-and-unlink race).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self, *, blocking: bool) -> bool:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        while True:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, flags)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.stat(self._path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last fd of the description drops the flock
            self._fd = None


def _hash_file(path: Path) -> tuple[int, str] | None:
    """(size, xxh3-128 hex) of a file; None if absent."""
    try:
        return size_and_digest(path)
    except FileNotFoundError:
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _components_match_hex(components: tuple[KeyComponent, ...], hex_: str) -> bool:
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


def _entry_from_json(obj: object, path: Path) -> StoreEntry:
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


def _record_json(entry: StoreEntry) -> dict[str, Any]:
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


def _row_json(entry: StoreEntry) -> dict[str, Any]:
    return {**_record_json(entry), "accessed_unix_s": entry.accessed_unix_s}


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
    ) -> None:
        if size_limit_bytes is not None and size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        self._root = Path(root).expanduser().absolute()
        self._strict = strict
        self._blobs = self._root / "blobs"
        self._tmp = self._root / "tmp"
        self._quarantine = self._root / "quarantine"
        self._locks = self._root / "locks"
        root_s = self._root
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            self._ensure_format()
            for d in (self._blobs, self._tmp, self._quarantine, self._locks):
                d.mkdir(exist_ok=True)
            # mkdir of existing folders proves nothing: probe a real write.
            fd, probe = tempfile.mkstemp(dir=self._tmp, prefix="probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreError(
                f"cache folder {root_s} is not writable ({exc.strerror or exc}); "
                f"pass --cache-dir or set {_ENV_ROOT}"
            ) from exc
        try:
            # eviction_policy none: diskcache must never drop our rows; we evict.
            self._index: Any = diskcache.Cache(
                str(self._root / "index"),
                eviction_policy="none",
                statistics=False,
                tag_index=False,
                size_limit=2**62,
                cull_limit=0,
            )
        except _IO_ERRORS as exc:
            raise StoreError(
                f"cache folder {root_s}: its index cannot be opened ({exc}); "
                f"pass --cache-dir or set {_ENV_ROOT}"
            ) from exc
        if size_limit_bytes is not None:
            self.set_size_limit(size_limit_bytes)

    # -- opening -----------------------------------------------------------------

    @staticmethod
    def default_root() -> Path:
        """``$OVSPEC_CACHE_DIR`` if set, else the user cache folder for ovspec."""
        env = os.environ.get(_ENV_ROOT)
        if env:
            return Path(env).expanduser()
        return Path(platformdirs.user_cache_dir("ovspec"))

    def _ensure_format(self) -> None:
        fmt = self._root / "FORMAT"
        try:
            text = fmt.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            text = None
        if text is None:
            foreign = sorted(
                p.name
                for p in self._root.iterdir()
                if p.name not in _ROOT_NAMES and not p.name.startswith(".FORMAT.")
            )
            if foreign:
                raise StoreError(
                    f"folder {self._root} is not an ovspec store (no FORMAT file) and holds "
                    f"{', '.join(foreign[:3])}; pass an empty or new --cache-dir"
                )
            tmp = self._root / f".FORMAT.{os.getpid()}.{secrets.token_hex(4)}"
            tmp.write_text(f"{_FORMAT_MAGIC} {STORE_FORMAT_VERSION}\n", encoding="utf-8")
            _fsync_file(tmp)
            os.replace(tmp, fmt)
            _fsync_dir(self._root)
            return
        magic, _, version = text.partition(" ")
        if magic != _FORMAT_MAGIC or not version.isdigit():
            raise StoreError(
                f"folder {self._root} is not an ovspec store (FORMAT says {text[:40]!r}); "
                "pass another --cache-dir"
            )
        if int(version) != STORE_FORMAT_VERSION:
            newer = "a newer" if int(version) > STORE_FORMAT_VERSION else "an older"
            raise StoreError(
                f"cache folder {self._root} has store format {version}, written by {newer} "
                f"ovspec; this one reads format {STORE_FORMAT_VERSION}; "
                "pass another --cache-dir or use a matching ovspec"
            )

    def close(self) -> None:
        self._index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def strict(self) -> bool:
        return self._strict

    @property
    def size_limit_bytes(self) -> int:
        value = self._index.get(_SIZE_LIMIT_SETTING, DEFAULT_SIZE_LIMIT_BYTES, retry=True)
        return int(value)

    def set_size_limit(self, size_limit_bytes: int) -> None:
        """Persist a new size limit (shared by every process using this root)."""
        if size_limit_bytes <= 0:
            raise StoreError(f"size limit must be > 0 bytes, got {size_limit_bytes}")
        self._index.set(_SIZE_LIMIT_SETTING, int(size_limit_bytes), retry=True)

    # -- paths and small helpers -----------------------------------------------------

    def _payload_path(self, hex_: str) -> Path:
        return self._blobs / hex_[:2] / f"{hex_}.blob"

    def _sidecar_path(self, hex_: str) -> Path:
        return self._blobs / hex_[:2] / f"{hex_}.json"

    def _key_lock(self, hex_: str) -> _KeyLock:
        return _KeyLock(self._locks / f"{hex_}.lock")

    @contextlib.contextmanager
    def _try_lock(self, hex_: str, *, held: bool = False) -> Iterator[bool]:
        """Yield whether this caller may change ``hex_``'s files (non-blocking)."""
        if held:
            yield True
            return
        lock = self._key_lock(hex_)
        got = lock.acquire(blocking=False)
        try:
            yield got
        finally:
            lock.release()

    def _new_temp(self, hex_: str, suffix: str) -> Path:
        path = self._tmp / f"{hex_}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}.part"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        return path

    def _fail_open(self, what: str, exc: BaseException) -> None:
        """Storage failure: raise when strict, else warn and let the caller go on."""
        message = f"blob store {self._root}: {what} ({exc})"
        if self._strict:
            raise StoreError(message) from exc
        log.warning("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=3)

    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=3)

    def _bump(self, name: str, delta: int = 1) -> None:
        self._index.incr(name, delta, default=0, retry=True)

    def _get_row(self, hex_: str) -> StoreEntry | None:
        """The index row of ``hex_``; None if absent. ValueError if malformed."""
        row = self._index.get(_ROW_PREFIX + hex_, default=None, retry=True)
        if row is None:
            return None
        entry = _entry_from_json(row, self._payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"row names hex {entry.hex}")
        return entry

    def _set_row(self, entry: StoreEntry) -> None:
        self._index.set(_ROW_PREFIX + entry.hex, _row_json(entry), retry=True)

    def _drop_row(self, hex_: str) -> bool:
        return bool(self._index.delete(_ROW_PREFIX + hex_, retry=True))

    def _row_hexes(self) -> list[str]:
        return [
            k[len(_ROW_PREFIX) :]
            for k in list(self._index)
            if isinstance(k, str) and k.startswith(_ROW_PREFIX)
        ]

    def _read_sidecar(self, hex_: str) -> StoreEntry | None:
        """The sidecar of ``hex_``; None if absent. ValueError if malformed."""
        try:
            text = self._sidecar_path(hex_).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"sidecar is not JSON: {exc}") from exc
        entry = _entry_from_json(obj, self._payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"sidecar names hex {entry.hex}")
        return entry

    def _write_sidecar(self, entry: StoreEntry) -> None:
        tmp = self._new_temp(entry.hex, "json")
        try:
            data = json.dumps(
                {"store_format": STORE_FORMAT_VERSION, **_record_json(entry)}, indent=1
            ).encode()
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            dest = self._sidecar_path(entry.hex)
            os.replace(tmp, dest)
            _fsync_dir(dest.parent)
        except BaseException:
            _unlink(tmp)
            raise

    def _verify(self, entry: StoreEntry) -> _Verdict:
        """Does the payload on disk match ``entry``'s size and checksum?"""
        try:
            size = entry.path.stat().st_size
        except FileNotFoundError:
            return _Verdict.MISSING
        if size != entry.size_bytes:
            return _Verdict.CORRUPT  # no need to hash a file of the wrong length
        measured = _hash_file(entry.path)
        if measured is None:
            return _Verdict.MISSING
        if measured != (entry.size_bytes, entry.checksum):
            return _Verdict.CORRUPT
        return _Verdict.OK

    def _move_to_quarantine(self, path: Path) -> bool:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        dest = self._quarantine / f"{path.name}.{stamp}.{secrets.token_hex(2)}"
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return False
        return True

    def _quarantine_entry(self, hex_: str) -> None:
        """Move payload and sidecar aside and drop the row. Caller holds the lock."""
        moved = self._move_to_quarantine(self._payload_path(hex_))
        self._move_to_quarantine(self._sidecar_path(hex_))
        self._drop_row(hex_)
        if moved:
            self._bump(_STAT_QUARANTINED)

    def _delete_entry_files(self, hex_: str) -> bool:
        """Drop the row, then the payload, then the sidecar. Caller holds the lock.

        Row first: a crash in between leaves payload+sidecar, which lookup or
        check(fix=True) re-index, never a row pointing at nothing. Returns whether
        there was a row (False: another process removed it first).
        """
        had_row = self._drop_row(hex_)
        _unlink(self._payload_path(hex_))
        _unlink(self._sidecar_path(hex_))
        return had_row

    def _touch(self, hex_: str) -> float:
        now = time.time()
        with self._index.transact(retry=True):
            row = self._index.get(_ROW_PREFIX + hex_, default=None)
            if isinstance(row, dict):
                self._index.set(_ROW_PREFIX + hex_, {**row, "accessed_unix_s": now})
        return now

    # -- reads -------------------------------------------------------------------

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
                self._bump(_STAT_MISSES)
            else:
                self._count_hit(entry)
        except _IO_ERRORS as exc:
            self._fail_open(f"lookup of {key.hex[:12]} failed; treating it as a miss", exc)
            return None
        return entry

    def _count_hit(self, entry: StoreEntry) -> None:
        self._bump(_STAT_HITS)
        self._bump(_STAT_SAVED_US, round(entry.compile_s * 1e6))

    def _lookup(self, key: BlobKey, *, held: bool) -> StoreEntry | None:
        hex_ = key.hex
        try:
            entry = self._get_row(hex_)
        except ValueError as exc:
            self._warn(f"index row of blob {hex_[:12]} is malformed ({exc}); ignoring it")
            entry = None
        if entry is not None:
            if entry.components != key.components:
                self._warn(f"index row of blob {hex_[:12]} names another key; ignoring it")
                return None
            verdict = self._verify(entry)
            if verdict is _Verdict.OK:
                return dataclasses.replace(entry, accessed_unix_s=self._touch(hex_))
            self._discard_bad(hex_, verdict, held=held)
            return None
        return self._heal(key, held=held)

    def _discard_bad(self, hex_: str, verdict: _Verdict, *, held: bool) -> None:
        if verdict is _Verdict.MISSING:
            what = "missing its payload; dropped the entry"
        else:
            what = "corrupt (size or checksum mismatch); quarantined it"
        self._warn(f"blob {hex_[:12]} in {self._root} is {what}; it will be rebuilt")
        with self._try_lock(hex_, held=held) as got:
            if not got:
                return  # another process is rebuilding this key right now
            # Re-verify under the lock: a producer may have replaced it meanwhile.
            try:
                entry = self._get_row(hex_)
            except ValueError:
                entry = None
            if entry is not None and self._verify(entry) is _Verdict.OK:
                return
            if verdict is _Verdict.MISSING:
                self._delete_entry_files(hex_)
            else:
                self._quarantine_entry(hex_)

    def _heal(self, key: BlobKey, *, held: bool) -> StoreEntry | None:
        """No index row: re-index payload + sidecar if they verify (self-heal)."""
        hex_ = key.hex
        if not self._payload_path(hex_).exists():
            return None
        try:
            sidecar = self._read_sidecar(hex_)
        except ValueError:
            return None  # check(fix=True) quarantines it; a producer overwrites it
        if sidecar is None or sidecar.components != key.components:
            return None  # no sidecar yet: possibly a write in progress
        with self._try_lock(hex_, held=held) as got:
            if not got or self._verify(sidecar) is not _Verdict.OK:
                return None
            entry = dataclasses.replace(sidecar, accessed_unix_s=time.time())
            self._index.add(_ROW_PREFIX + hex_, _row_json(entry), retry=True)
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
            self._fail_open(f"lookup of {hex_[:12]} failed", exc)
            return self._produce_outside(key, produce)
        if entry is not None:
            self._count_hit_open(entry)
            return self._outcome(entry, hit=True, wait_s=0.0)

        lock = self._key_lock(hex_)
        wait_s = 0.0
        try:
            if not lock.acquire(blocking=False):
                t0 = time.perf_counter()
                lock.acquire(blocking=True)
                wait_s = time.perf_counter() - t0
        except OSError as exc:
            self._fail_open(f"cannot lock {hex_[:12]}", exc)
            return self._produce_outside(key, produce)
        try:
            return self._create_locked(key, produce, wait_s)
        finally:
            lock.release()

    def _count_hit_open(self, entry: StoreEntry) -> None:
        try:
            self._count_hit(entry)
        except _IO_ERRORS as exc:
            self._fail_open("cannot update statistics", exc)

    def _outcome(self, entry: StoreEntry, *, hit: bool, wait_s: float) -> BlobOutcome:
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

    def _create_locked(
        self, key: BlobKey, produce: Callable[[Path], ProducedBlob], wait_s: float
    ) -> BlobOutcome:
        hex_ = key.hex
        try:
            # Re-check: whoever held the lock before us may have stored it.
            entry = self._lookup(key, held=True)
            if entry is not None:
                self._count_hit(entry)
                return self._outcome(entry, hit=True, wait_s=wait_s)
            self._bump(_STAT_MISSES)
            tmp = self._new_temp(hex_, "blob")
        except _IO_ERRORS as exc:
            self._fail_open(f"cannot write {hex_[:12]} into the store", exc)
            return self._produce_outside(key, produce, wait_s=wait_s)

        try:
            produced = produce(tmp)
        except BaseException:
            _unlink(tmp)
            raise
        if not isinstance(produced, ProducedBlob):
            _unlink(tmp)
            raise TypeError(f"produce must return a ProducedBlob, got {type(produced).__name__}")
        if not tmp.is_file():
            raise StoreError(f"the producer of blob {hex_[:12]} left no file at {tmp}")

        try:
            entry = self._commit(key, tmp, produced)
        except _IO_ERRORS as exc:
            if self._strict:
                _unlink(tmp)
                raise StoreError(
                    f"blob store {self._root}: cannot store blob {hex_[:12]} ({exc})"
                ) from exc
            self._fail_open(f"cannot store blob {hex_[:12]}; returning it from outside", exc)
            path = self._evacuate(hex_, tmp)
            return BlobOutcome(
                path=path,
                hex=hex_,
                hit=False,
                stored=False,
                compile_s=produced.compile_s,
                wait_s=wait_s,
                size_bytes=path.stat().st_size,
                metadata=produced.metadata,
            )
        try:
            self._evict_to_limit(keep=hex_)
        except _IO_ERRORS as exc:
            self._fail_open("eviction after a put failed", exc)
        return self._outcome(entry, hit=False, wait_s=wait_s)

    def _commit(self, key: BlobKey, tmp: Path, produced: ProducedBlob) -> StoreEntry:
        """fsync + checksum the temp, rename it in, then the sidecar, then the row.

        A crash at any point leaves no entry or a complete one: the row (what
        lookup trusts) is written last, and lookup re-indexes payload+sidecar
        only after verifying them. On failure the payload is put back at ``tmp``.
        """
        hex_ = key.hex
        final = self._payload_path(hex_)
        moved = False
        try:
            _fsync_file(tmp)
            measured = _hash_file(tmp)
            if measured is None:
                raise FileNotFoundError(errno.ENOENT, "temp payload vanished", str(tmp))
            size, checksum = measured
            if not final.parent.is_dir():
                final.parent.mkdir(exist_ok=True)
                _fsync_dir(self._blobs)
            os.replace(tmp, final)
            moved = True
            _fsync_dir(final.parent)
            now = time.time()
            entry = StoreEntry(
                hex=hex_,
                path=final,
                size_bytes=size,
                checksum=checksum,
                created_unix_s=now,
                accessed_unix_s=now,
                compile_s=produced.compile_s,
                components=key.components,
                metadata=produced.metadata,
            )
            self._write_sidecar(entry)
            self._set_row(entry)
        except BaseException:
            with contextlib.suppress(*_IO_ERRORS):
                self._drop_row(hex_)
            with contextlib.suppress(OSError):
                _unlink(self._sidecar_path(hex_))
            if moved:
                with contextlib.suppress(OSError):
                    os.replace(final, tmp)
            raise
        return entry

    def _evacuate(self, hex_: str, tmp: Path) -> Path:
        """Move a payload the store could not keep to a private temp folder."""
        src = tmp if tmp.exists() else self._payload_path(hex_)
        try:
            dest = Path(tempfile.mkdtemp(prefix=f"ovspec-{hex_[:12]}-")) / f"{hex_}.blob"
            shutil.move(src, dest)
        except OSError as exc:
            # Nowhere else to put it: hand out the file where it is.
            self._warn(f"cannot move blob {hex_[:12]} out of the store ({exc}); using {src}")
            return src
        return dest

    def _produce_outside(
        self, key: BlobKey, produce: Callable[[Path], ProducedBlob], *, wait_s: float = 0.0
    ) -> BlobOutcome:
        """Fail-open path: compile into a private temp folder, store nothing."""
        folder = Path(tempfile.mkdtemp(prefix=f"ovspec-{key.hex[:12]}-"))
        path = folder / f"{key.hex}.blob"
        try:
            produced = produce(path)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return BlobOutcome(
            path=path,
            hex=key.hex,
            hit=False,
            stored=False,
            compile_s=produced.compile_s,
            wait_s=wait_s,
            size_bytes=path.stat().st_size,
            metadata=produced.metadata,
        )

    # -- eviction and removal ------------------------------------------------------

    def _evict_to_limit(self, keep: str | None) -> tuple[int, int]:
        """Evict least-recently-used entries until under the limit.

        Never evicts ``keep`` (the entry just written) nor the last entry left, so
        a single blob over the limit is kept (with a warning). Entries whose lock
        is busy are skipped. Returns (entries evicted, bytes freed).
        """
        limit = self.size_limit_bytes
        entries = self.entries()
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
            with self._try_lock(victim.hex) as got:
                if not got or not self._delete_entry_files(victim.hex):
                    continue  # busy, or another process evicted it first
            self._bump(_STAT_EVICTIONS)
            log.info("evicted blob %s (%d bytes)", victim.hex[:12], victim.size_bytes)
            total -= victim.size_bytes
            remaining -= 1
            evicted += 1
            freed += victim.size_bytes
        if total > limit:
            self._warn(
                f"blob store {self._root} holds {total} bytes, over its size limit of "
                f"{limit} bytes after evicting what it could (the newest blob is always kept)"
            )
        return evicted, freed

    def remove(self, hex_: str) -> bool:
        """Remove the entry with this full hex; False if there is none."""
        with self._locked_io("remove an entry"):
            if not self._has_row(hex_):
                return False
            lock = self._key_lock(hex_)
            lock.acquire(blocking=True)
            try:
                return self._delete_entry_files(hex_)
            finally:
                lock.release()

    def clear(self) -> int:
        """Remove every entry, quarantined file and stale temp; reset the counters.

        Keeps the settings (size limit). Returns the number of entries removed.
        """
        with self._locked_io("clear the store"):
            removed = sum(self.remove(h) for h in self._row_hexes())
            for path in self._blobs.glob("*/*"):
                m = _PAYLOAD_RE.fullmatch(path.name) or _SIDECAR_RE.fullmatch(path.name)
                if m is None:
                    _unlink(path)
                    continue
                with self._try_lock(m["hex"]) as got:
                    if got:
                        _unlink(path)
            for path in self._quarantine.iterdir():
                _unlink(path)
            self._remove_stale_temps()
            for name in _COUNTERS:
                self._index.delete(name, retry=True)
            return removed

    def _has_row(self, hex_: str) -> bool:
        return bool((_ROW_PREFIX + hex_) in self._index)

    @contextlib.contextmanager
    def _locked_io(self, what: str) -> Iterator[None]:
        """Maintenance operations surface storage failures as StoreError."""
        try:
            yield
        except _IO_ERRORS as exc:
            raise StoreError(f"blob store {self._root}: cannot {what} ({exc})") from exc

    # -- listing and statistics --------------------------------------------------------

    def entries(self) -> list[StoreEntry]:
        """Every well-formed index row, most recently used first (not verified)."""
        out: list[StoreEntry] = []
        for hex_ in self._row_hexes():
            try:
                entry = self._get_row(hex_)
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
        with self._locked_io("read statistics"):
            entries = self.entries()

            def counter(name: str) -> int:
                return int(self._index.get(name, default=0, retry=True))

            return StoreStats(
                hits=counter(_STAT_HITS),
                misses=counter(_STAT_MISSES),
                saved_s=counter(_STAT_SAVED_US) / 1e6,
                entries=len(entries),
                stored_bytes=sum(e.size_bytes for e in entries),
                size_limit_bytes=self.size_limit_bytes,
                evictions=counter(_STAT_EVICTIONS),
                quarantined=counter(_STAT_QUARANTINED),
            )

    # -- self-check and garbage collection -----------------------------------------------

    def check(self, fix: bool = False) -> list[str]:
        """Problems found in index, payloads, sidecars and temps; [] when healthy.

        With ``fix=True`` each problem is also repaired (the list still names
        what was found, like ``diskcache.Cache.check``): orphan payloads are
        re-indexed when their sidecar verifies, else quarantined; corrupt ones are
        quarantined; stale temps deleted; sidecars rewritten from a verified row;
        entries over the size limit evicted. Keys whose lock is held (a write in
        progress) are skipped. Every payload is hashed: cost ~ bytes stored.
        """
        with self._locked_io("check the store"):
            problems = self._check(fix)
            limit = self.size_limit_bytes
            entries = self.entries()
            total = sum(e.size_bytes for e in entries)
            if total > limit and len(entries) > 1:
                problems.append(
                    f"store holds {total} bytes in {len(entries)} entries, over its size "
                    f"limit of {limit} bytes"
                )
                if fix:
                    self._evict_to_limit(keep=None)
            return problems

    def _check(self, fix: bool) -> list[str]:
        problems: list[str] = []
        fmt = self._root / "FORMAT"
        if not fmt.is_file():
            problems.append("FORMAT file missing")
            if fix:
                self._ensure_format()
        index_warnings = self._index.check(fix=False, retry=True)
        problems += [f"index: {w.message}" for w in index_warnings]
        if fix and index_warnings:
            # Only now: diskcache's fix runs VACUUM, which waits for other writers.
            self._index.check(fix=True, retry=True)

        hexes: set[str] = set()
        for hex_ in self._row_hexes():
            if _HEX_RE.fullmatch(hex_):
                hexes.add(hex_)
                continue
            problems.append(f"index: row {_ROW_PREFIX + hex_!r} does not name a key")
            if fix:
                self._drop_row(hex_)
        for path in sorted(self._blobs.glob("*")):
            if not path.is_dir():
                problems.append(f"unexpected file blobs/{path.name}")
                if fix:
                    self._move_to_quarantine(path)
                continue
            for child in sorted(path.iterdir()):
                m = _PAYLOAD_RE.fullmatch(child.name) or _SIDECAR_RE.fullmatch(child.name)
                if m is None or m["hex"][:2] != path.name:
                    problems.append(f"unexpected file blobs/{path.name}/{child.name}")
                    if fix:
                        self._move_to_quarantine(child)
                    continue
                hexes.add(m["hex"])
        temps: dict[str, list[Path]] = {}
        now = time.time()
        for path in sorted(self._tmp.iterdir()):
            m = _TEMP_RE.fullmatch(path.name)
            if m is not None:
                temps.setdefault(m["hex"], []).append(path)
                hexes.add(m["hex"])
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > STALE_TEMP_S:
                    problems.append(f"stale temp file tmp/{path.name}")
                    if fix:
                        _unlink(path)

        for hex_ in sorted(hexes):
            with self._try_lock(hex_) as got:
                if got:  # else a producer is writing this key right now
                    problems += self._check_key(hex_, temps.get(hex_, []), fix)
        return problems

    def _check_key(self, hex_: str, temps: list[Path], fix: bool) -> list[str]:
        """Check one key's row, payload, sidecar and temps. Caller holds its lock."""
        problems: list[str] = []
        short = hex_[:12]
        for t in temps:
            problems.append(f"stale temp file tmp/{t.name} from an interrupted write of {short}")
            if fix:
                _unlink(t)

        try:
            row = self._get_row(hex_)
        except ValueError as exc:
            problems.append(f"entry {short}: index row is malformed ({exc})")
            if fix:
                self._drop_row(hex_)
            row = None
        sidecar: StoreEntry | None
        sidecar_bad = False
        try:
            sidecar = self._read_sidecar(hex_)
        except ValueError as exc:
            problems.append(f"entry {short}: sidecar is malformed ({exc})")
            sidecar, sidecar_bad = None, True
        payload = self._payload_path(hex_)
        measured = _hash_file(payload)

        def matches(e: StoreEntry | None) -> bool:
            return (
                e is not None
                and measured == (e.size_bytes, e.checksum)
                and _components_match_hex(e.components, hex_)
            )

        if row is not None:
            if measured is None:
                problems.append(f"entry {short}: payload missing (index row without payload)")
                if fix:
                    self._delete_entry_files(hex_)
            elif matches(row):
                if sidecar is None:
                    if not sidecar_bad:
                        problems.append(f"entry {short}: sidecar missing")
                    if fix:
                        self._write_sidecar(row)
                elif _record_json(sidecar) != _record_json(row):
                    problems.append(f"entry {short}: sidecar disagrees with the index row")
                    if fix:
                        self._write_sidecar(row)
            elif matches(sidecar):
                problems.append(
                    f"entry {short}: index row disagrees with the payload (the sidecar matches)"
                )
                if fix and sidecar is not None:
                    self._set_row(dataclasses.replace(sidecar, accessed_unix_s=time.time()))
            else:
                problems.append(f"entry {short}: payload corrupt (size or checksum mismatch)")
                if fix:
                    self._quarantine_entry(hex_)
        elif measured is not None:
            if matches(sidecar) and sidecar is not None:
                problems.append(f"payload {short} has no index row (its sidecar verifies)")
                if fix:
                    self._index.add(
                        _ROW_PREFIX + hex_,
                        _row_json(dataclasses.replace(sidecar, accessed_unix_s=time.time())),
                        retry=True,
                    )
            else:
                problems.append(f"payload {short} has no index row and no valid sidecar")
                if fix:
                    self._quarantine_entry(hex_)
        elif sidecar is not None or sidecar_bad:
            problems.append(f"sidecar {short} has no payload")
            if fix:
                _unlink(self._sidecar_path(hex_))
        return problems

    def _remove_stale_temps(self) -> int:
        removed = 0
        now = time.time()
        for path in self._tmp.iterdir():
            m = _TEMP_RE.fullmatch(path.name)
            if m is None:
                with contextlib.suppress(FileNotFoundError):
                    if now - path.stat().st_mtime > STALE_TEMP_S:
                        removed += _unlink(path)
                continue
            with self._try_lock(m["hex"]) as got:
                if got:
                    removed += _unlink(path)
        return removed

    def gc(self) -> GcReport:
        """Repair what check(fix=True) repairs, evict to the size limit, and drop idle
        lock files and quarantined payloads older than a week."""
        with self._locked_io("collect garbage"):
            repaired = self._check(fix=True)
            evicted, freed = self._evict_to_limit(keep=None)
            live = set(self._row_hexes())
            locks_removed = 0
            for path in self._locks.iterdir():
                m = _LOCK_RE.fullmatch(path.name)
                if m is None or m["hex"] in live:
                    continue
                lock = _KeyLock(path)
                if lock.acquire(blocking=False):
                    try:
                        # Unlinking while holding it: later acquirers notice the
                        # inode change and reopen (see _KeyLock).
                        if m["hex"] not in set(self._row_hexes()):
                            locks_removed += _unlink(path)
                    finally:
                        lock.release()
            purged = 0
            cutoff = time.time() - QUARANTINE_KEEP_S
            for path in self._quarantine.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < cutoff:
                        purged += _unlink(path)
            return GcReport(
                evicted_entries=evicted,
                freed_bytes=freed,
                repaired=tuple(repaired),
                locks_removed=locks_removed,
                quarantine_purged=purged,
            )
