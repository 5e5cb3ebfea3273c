"""What a read does with an entry that is not right: re-index a payload whose row is
lost (from its verified sidecar), drop an entry whose payload is gone, quarantine one
whose bytes are corrupt or that its consumer cannot use.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ovspec.store.core import StoreCore
from ovspec.store.files import is_regular, verify
from ovspec.store.index import INDEX_ERRORS
from ovspec.store.keys import BlobKey
from ovspec.store.records import StoreEntry, Verdict, row_json

log = logging.getLogger(__name__)

_IO_ERRORS_OR_MALFORMED: tuple[type[BaseException], ...] = (*INDEX_ERRORS, ValueError)


def discard_bad(
    store: StoreCore, hex_: str, seen: StoreEntry, verdict: Verdict, *, held: bool
) -> None:
    """A payload that failed verification: drop (missing) or quarantine (corrupt).

    Every repair here takes the key's lock without waiting (a busy key is being rebuilt
    by its holder) and re-checks under it, so an entry another process just rebuilt is
    left alone. A read-only store changes nothing: it only warns.
    """
    if verdict is Verdict.MISSING and not store.index.has_row(hex_):
        return  # removed by another process (evicted, cleared) meanwhile: a plain miss
    if store.read_only:
        store.warn(f"blob {hex_[:12]} in read-only store {store.root} is {verdict.value}")
        return
    if verdict is Verdict.MISSING:
        what = "missing its payload; dropped the entry"
    else:
        what = "corrupt (size or checksum mismatch); quarantined it"
    store.warn(f"blob {hex_[:12]} in {store.root} is {what}; it will be rebuilt")
    with store.try_lock(hex_, held=held) as got:
        if not got:
            return  # another process is rebuilding this key right now
        # Re-verify under the lock: a producer may have replaced it meanwhile.
        try:
            entry = store.row(hex_)
        except ValueError:
            entry = None
        if entry is not None and entry.checksum != seen.checksum:
            return
        if entry is not None and verify(entry) is Verdict.OK:
            return
        if verdict is Verdict.MISSING:
            store.delete_entry_files(hex_)
        else:
            store.quarantine_entry(hex_)


def reindex(store: StoreCore, key: BlobKey, *, held: bool) -> StoreEntry | None:
    """No index row: re-index payload + sidecar if they verify (self-heal)."""
    hex_ = key.hex
    if is_regular(store.layout.payload_path(hex_)) is not True:
        return None
    try:
        sidecar = store.files.read_sidecar(hex_)
    except ValueError:
        return None  # check(fix=True) quarantines it; a producer overwrites it
    if sidecar is None or sidecar.components != key.components:
        return None  # no sidecar yet: possibly a write in progress
    if store.read_only:
        return sidecar  # served as it is; the caller verifies its bytes
    with store.try_lock(hex_, held=held) as got:
        if not got or verify(sidecar) is not Verdict.OK:
            return None
        entry = dataclasses.replace(sidecar, accessed_unix_s=time.time())
        store.index.add_row(hex_, row_json(entry))
        log.info("re-indexed blob %s from its sidecar", hex_[:12])
        return entry


def quarantine(store: StoreCore, hex_: str, checksum: str, why: str) -> bool:
    """Move a stored entry aside because a consumer found it unusable (its bytes
    verify, but the device cannot import them, e.g. a blob an older ovspec stored from
    a short write). Only the entry with ``checksum`` is touched, so one that another
    process already rebuilt stays. Whether it was moved."""
    if store.read_only:
        store.warn(f"blob {hex_[:12]} in read-only store {store.root} is unusable ({why})")
        return False
    store.warn(f"blob {hex_[:12]} in {store.root} is unusable ({why}); quarantined it")
    try:
        with store.try_lock(hex_) as got:
            if not got:
                return False
            entry = store.row(hex_)
            if entry is None or entry.checksum != checksum:
                return False
            store.quarantine_entry(hex_)
            return True
    except _IO_ERRORS_OR_MALFORMED as exc:
        store.fail_open(f"cannot quarantine blob {hex_[:12]}", exc)
        return False
