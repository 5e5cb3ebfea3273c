"""Turning a produced payload into a store entry, or handing it out when the store
cannot keep it.

The write path of ``Store.get_or_create`` once the key's lock is held: re-check,
produce into a temp file, then commit (fsync, checksum, rename, sidecar, row) or
fail open into a private temp folder outside the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ovspec.errors import StoreError
from ovspec.store.files import hash_file, unlink
from ovspec.store.index import INDEX_ERRORS, STAT_MISSES
from ovspec.store.keys import BlobKey
from ovspec.store.layout import fsync_dir, fsync_file
from ovspec.store.records import BlobOutcome, ProducedBlob, StoreEntry

if TYPE_CHECKING:
    from ovspec.store.local import Store


def create_locked(
    store: Store, key: BlobKey, produce: Callable[[Path], ProducedBlob], wait_s: float
) -> BlobOutcome:
    hex_ = key.hex
    try:
        # Re-check: whoever held the lock before us may have stored it.
        entry = store.lookup_locked(key)
        if entry is not None:
            store.count_hit(entry)
            return store.outcome(entry, hit=True, wait_s=wait_s)
        store.index.bump(STAT_MISSES)
        tmp = store.layout.new_temp(hex_, "blob")
    except INDEX_ERRORS as exc:
        store.fail_open(f"cannot write {hex_[:12]} into the store", exc)
        return produce_outside(store, key, produce, wait_s=wait_s)

    try:
        produced = produce(tmp)
    except BaseException:
        unlink(tmp)
        raise
    if not isinstance(produced, ProducedBlob):
        unlink(tmp)
        raise TypeError(f"produce must return a ProducedBlob, got {type(produced).__name__}")
    if not tmp.is_file():
        raise StoreError(f"the producer of blob {hex_[:12]} left no file at {tmp}")

    try:
        entry = commit(store, key, tmp, produced)
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
        store.evict_to_limit(keep=hex_)
    except INDEX_ERRORS as exc:
        store.fail_open("eviction after a put failed", exc)
    return store.outcome(entry, hit=False, wait_s=wait_s)


def commit(store: Store, key: BlobKey, tmp: Path, produced: ProducedBlob) -> StoreEntry:
    """fsync + checksum the temp, rename it in, then the sidecar, then the row.

    A crash at any point leaves no entry or a complete one: the row (what
    lookup trusts) is written last, and lookup re-indexes payload+sidecar
    only after verifying them. On failure the payload is put back at ``tmp``.
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
        if not final.parent.is_dir():
            final.parent.mkdir(exist_ok=True)
            fsync_dir(store.layout.blobs)
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


def evacuate(store: Store, hex_: str, tmp: Path) -> Path:
    """Move a payload the store could not keep to a private temp folder."""
    src = tmp if tmp.exists() else store.layout.payload_path(hex_)
    try:
        dest = Path(tempfile.mkdtemp(prefix=f"ovspec-{hex_[:12]}-")) / f"{hex_}.blob"
        shutil.move(src, dest)
    except OSError as exc:
        # Nowhere else to put it: hand out the file where it is.
        store.warn(f"cannot move blob {hex_[:12]} out of the store ({exc}); using {src}")
        return src
    return dest


def produce_outside(
    store: Store, key: BlobKey, produce: Callable[[Path], ProducedBlob], *, wait_s: float = 0.0
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
