"""The local store's verified read, the one way a stored entry is handed out: the row
(re-indexed from its sidecar when lost), its key checked, the payload mapped and hashed,
the access time kept; an entry that fails a step goes to ``healing`` and reads as a miss.
"""

from __future__ import annotations

import dataclasses
import mmap
import time

from ovspec.errors import BlobRefusedError
from ovspec.store import healing
from ovspec.store.core import StoreCore
from ovspec.store.files import map_verified
from ovspec.store.index import INDEX_ERRORS, STAT_HITS, STAT_SAVED_US
from ovspec.store.keys import BlobKey
from ovspec.store.records import StoreEntry, Verdict


def lookup(
    core: StoreCore, key: BlobKey, *, held: bool, mapped: bool, refuse: bool = False
) -> tuple[StoreEntry | None, mmap.mmap | None]:
    """A verified entry for ``key`` (and, if ``mapped``, the mapping whose bytes were
    verified), or (None, None). ``held``: the caller holds the key's lock. ``refuse``:
    corrupt bytes raise ``BlobRefusedError`` (once set aside) instead of reading as a
    miss."""
    hex_ = key.hex
    try:
        entry = core.row(hex_)
    except ValueError as exc:
        core.warn(f"index row of blob {hex_[:12]} is malformed ({exc}); ignoring it")
        entry = None
    if entry is None:
        entry = healing.reindex(core, key, held=held)
        if entry is None:
            return None, None
    elif entry.components != key.components:
        core.warn(f"index row of blob {hex_[:12]} names another key; ignoring it")
        return None, None
    # Verify the bytes the caller will read: one mapping, hashed, then handed out.
    verdict, mapping = map_verified(entry)
    if verdict is Verdict.OK:
        if not mapped and mapping is not None:
            mapping.close()
            mapping = None
        try:
            accessed = time.time()
            core.index.touch(hex_, accessed)
        except INDEX_ERRORS as exc:
            # A verified hit stays a hit when only its access time cannot be kept
            # (a full disk under the index).
            core.fail_open("cannot record an access time", exc)
            accessed = entry.accessed_unix_s
        return dataclasses.replace(entry, accessed_unix_s=accessed), mapping
    healing.discard_bad(core, hex_, entry, verdict, held=held)
    if refuse and verdict is Verdict.CORRUPT:
        raise BlobRefusedError(f"blob {hex_[:12]} in {core.root} failed verification")
    return None, None


def count_hit(core: StoreCore, entry: StoreEntry) -> None:
    """A hit and the compile seconds it saved (raises the index's errors)."""
    core.index.bump(STAT_HITS)
    core.index.bump(STAT_SAVED_US, round(entry.compile_s * 1e6))
