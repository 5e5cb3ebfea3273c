"""The local store's write path once the key's lock is held: produce into a temp file,
prove the payload whole, ``commit`` it (fsync, checksum, rename, sidecar, row) or fail
open into a private temp folder. ``commit`` is the one way a payload enters the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ovspec.errors import StoreError
from ovspec.store.core import StoreCore
from ovspec.store.files import hash_file, unlink
from ovspec.store.index import INDEX_ERRORS, STAT_MISSES
from ovspec.store.keys import BlobKey
from ovspec.store.layout import fsync_dir, fsync_file
from ovspec.store.lookup import count_hit, lookup
from ovspec.store.maintenance import evict_to_limit
from ovspec.store.records import (
    OUTSIDE_PREFIX,
    BlobOutcome,
    BlobRecord,
    PayloadWriteError,
    ProducedBlob,
    StoreEntry,
)
from ovspec.store.storage import PutResult

Producer = Callable[[Path], ProducedBlob]
_EVICTION_ERRORS: tuple[type[BaseException], ...] = (*INDEX_ERRORS, StoreError)
# Raises (any exception) when the payload at the path is not usable; called before
# the payload is published, so a blob the device cannot import is never stored.
Validator = Callable[[Path], None]


def create_locked(
    store: StoreCore, key: BlobKey, produce: Producer, wait_s: float, validate: Validator | None
) -> BlobOutcome:
    """Re-check, produce into a temp file, prove the payload whole (the size the producer
    counted, not empty, and ``validate`` accepts it: the device imports it), then commit
    it, or fail open outside the store. The caller holds the key's lock."""
    hex_ = key.hex
    try:
        # Re-check: whoever held the lock before us may have stored it.
        entry, mapping = lookup(store, key, held=True, mapped=True)
        if entry is not None:
            count_hit(store, entry)
            return BlobOutcome.stored_entry(entry, hit=True, wait_s=wait_s, payload=mapping)
        store.index.bump(STAT_MISSES)
        tmp = store.layout.new_temp(hex_, "blob")
    except INDEX_ERRORS as exc:
        store.fail_open(f"cannot write {hex_[:12]} into the store", exc)
        return produce_outside(store, key, produce, validate, wait_s=wait_s)

    try:
        produced = produce(tmp)
        if not isinstance(produced, ProducedBlob):
            raise TypeError(f"produce must return a ProducedBlob, got {type(produced).__name__}")
        prove_whole(hex_, tmp, produced)
        if validate is not None:
            validate(tmp)
    except PayloadWriteError as exc:
        unlink(tmp)
        if store.strict:
            raise StoreError(
                f"blob store {store.root}: cannot write blob {hex_[:12]} ({exc.strerror or exc})"
            ) from exc
        store.fail_open(f"cannot write blob {hex_[:12]} into the store; compiling it outside", exc)
        return produce_outside(store, key, produce, validate, wait_s=wait_s)
    except BaseException:
        unlink(tmp)
        raise

    try:
        entry = commit(store, key, tmp, produced, expected_checksum=produced.checksum)
    except INDEX_ERRORS as exc:
        if store.strict:
            unlink(tmp)
            raise StoreError(
                f"blob store {store.root}: cannot store blob {hex_[:12]} ({exc})"
            ) from exc
        store.fail_open(f"cannot store blob {hex_[:12]}; returning it from outside", exc)
        path = evacuate(store, hex_, tmp)
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
        evict_to_limit(store, keep=hex_)
    except _EVICTION_ERRORS as exc:
        store.fail_open("eviction after a put failed", exc)
    return BlobOutcome.stored_entry(entry, hit=False, wait_s=wait_s)


def put_locked(store: StoreCore, key: BlobKey, source: Path, record: BlobRecord) -> PutResult:
    """Copy the payload at ``source`` in and commit it as ``record`` says, unless a
    verified entry is there already. The caller holds the key's lock."""
    hex_ = key.hex
    entry, _ = lookup(store, key, held=True, mapped=False)
    if entry is not None:
        return PutResult(stored=False, moved_bytes=0)
    tmp = store.layout.new_temp(hex_, "blob")
    produced = ProducedBlob(
        compile_s=record.compile_s, metadata=record.metadata, size_bytes=record.size_bytes
    )
    try:
        shutil.copyfile(source, tmp)
        commit(store, key, tmp, produced, expected_checksum=record.checksum)
    except BaseException:
        unlink(tmp)
        raise
    try:
        evict_to_limit(store, keep=hex_)
    except _EVICTION_ERRORS as exc:
        store.fail_open("eviction after a put failed", exc)
    return PutResult(stored=True, moved_bytes=record.size_bytes)


def prove_whole(hex_: str, path: Path, produced: ProducedBlob) -> None:
    """Refuse a payload that cannot be what the producer meant to write.

    ``export_model`` swallows the exceptions of the stream it writes to, so a write
    that failed half-way (disk full, RLIMIT_FSIZE, EIO) leaves a short file that must
    not be checksummed and published as a valid entry.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StoreError(f"the producer of blob {hex_[:12]} left no file at {path}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"the producer of blob {hex_[:12]} left something else than a file")
    if produced.size_bytes is not None and st.st_size != produced.size_bytes:
        raise PayloadWriteError(
            errno.EIO,
            f"the payload is {st.st_size} bytes but its producer wrote {produced.size_bytes}",
            str(path),
        )
    if st.st_size == 0:
        raise StoreError(f"the producer of blob {hex_[:12]} wrote an empty payload")


def commit(
    store: StoreCore,
    key: BlobKey,
    tmp: Path,
    produced: ProducedBlob,
    *,
    expected_checksum: str | None = None,
) -> StoreEntry:
    """fsync + checksum the temp, rename it in, then the sidecar, then the row.

    The caller holds the key's lock and made ``tmp`` with ``layout.new_temp`` (same
    filesystem). ``expected_checksum``: for a payload that came from elsewhere (a remote
    tier), the checksum it must have; a mismatch publishes nothing (``ValueError``).

    A crash at any point leaves no entry or a complete one: the row (what lookup
    trusts) is written last, and lookup re-indexes payload+sidecar only after
    verifying them. On failure the payload is put back at ``tmp``.
    """
    hex_ = key.hex
    final = store.layout.payload_path(hex_)
    moved = False
    try:
        fsync_file(tmp)
        measured = hash_file(tmp)
        if measured is None:
            raise FileNotFoundError(errno.ENOENT, "temp payload vanished", str(tmp))
        size, checksum = measured
        if expected_checksum is not None and checksum != expected_checksum:
            raise ValueError(
                f"payload for {hex_[:12]} has checksum {checksum}, expected {expected_checksum}"
            )
        if produced.size_bytes is not None and size != produced.size_bytes:
            raise PayloadWriteError(errno.EIO, "the payload changed size before it was published")
        if not final.parent.is_dir():
            store.files.clear_way(final.parent)
            with contextlib.suppress(FileExistsError):
                os.mkdir(final.parent, 0o700)
            fsync_dir(store.layout.blobs)
        store.files.clear_way(final)
        os.replace(tmp, final)
        moved = True
        fsync_dir(final.parent)
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
        store.files.write_sidecar(entry)
        store.set_row(entry)
    except BaseException:
        with contextlib.suppress(*INDEX_ERRORS):
            store.index.drop_row(hex_)
        with contextlib.suppress(OSError):
            unlink(store.layout.sidecar_path(hex_))
        if moved:
            with contextlib.suppress(OSError):
                os.replace(final, tmp)
        raise
    return entry


def _outside_folder(hex_: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{OUTSIDE_PREFIX}{hex_[:12]}-"))


def evacuate(store: StoreCore, hex_: str, tmp: Path) -> Path:
    """Move a payload the store could not keep to a private temp folder."""
    src = tmp if tmp.exists() else store.layout.payload_path(hex_)
    folder: Path | None = None
    try:
        folder = _outside_folder(hex_)
        dest = folder / f"{hex_}.blob"
        shutil.move(src, dest)
    except OSError as exc:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        # Nowhere else to put it: hand out the file where it is.
        store.warn(f"cannot move blob {hex_[:12]} out of the store ({exc}); using {src}")
        return src
    return dest


def produce_outside(
    store: StoreCore,
    key: BlobKey,
    produce: Producer,
    validate: Validator | None,
    *,
    wait_s: float = 0.0,
) -> BlobOutcome:
    """Fail-open path: compile into a private temp folder, store nothing."""
    folder = _outside_folder(key.hex)
    path = folder / f"{key.hex}.blob"
    try:
        produced = produce(path)
        prove_whole(key.hex, path, produced)
        if validate is not None:
            validate(path)
    except PayloadWriteError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise StoreError(
            f"cannot write blob {key.hex[:12]}, neither into {store.root} nor into a temp "
            f"folder ({exc.strerror or exc}); free some space or raise the file size limit"
        ) from exc
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
