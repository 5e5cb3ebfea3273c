"""Reading what a store holds without changing it: a cheap "would this hit?", finding
an entry by a key prefix, and the statistics. Nothing here hashes, counts or touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ovspec.errors import StoreError
from ovspec.store.index import (
    INDEX_ERRORS,
    STAT_EVICTIONS,
    STAT_HITS,
    STAT_MISSES,
    STAT_QUARANTINED,
    STAT_SAVED_US,
)
from ovspec.store.keys import BlobKey
from ovspec.store.records import StoreEntry, StoreStats

if TYPE_CHECKING:
    from ovspec.store.local import Store


def peek(store: Store, key: BlobKey) -> bool:
    """Whether ``key`` looks stored (a row naming it and a payload of its size), without
    hashing, counting or touching anything: a cheap "would this hit?". ``lookup``
    still verifies before anything is used."""
    try:
        entry = store.get_row(key.hex)
    except (ValueError, *INDEX_ERRORS):  # type: ignore[misc]
        return False
    if entry is None or entry.components != key.components:
        return False
    try:
        return entry.path.stat().st_size == entry.size_bytes
    except OSError:
        return False


def find(store: Store, prefix: str) -> StoreEntry:
    """The entry whose hex starts with ``prefix``; StoreError if none or several."""
    needle = prefix.strip().lower()
    if not needle:
        raise StoreError("empty key prefix; give the first hex digits of an entry")
    matches = [e for e in store.entries() if e.hex.startswith(needle)]
    if not matches:
        raise StoreError(f"no entry matches {prefix!r}; see `ovspec cache ls`")
    if len(matches) > 1:
        shown = ", ".join(e.hex[:12] for e in matches[:4])
        raise StoreError(
            f"prefix {prefix!r} is ambiguous: it matches {len(matches)} entries "
            f"({shown}); give more digits"
        )
    return matches[0]


def stats(store: Store) -> StoreStats:
    with store.locked_io("read statistics"):
        entries = store.entries()
        counter = store.index.counter
        return StoreStats(
            hits=counter(STAT_HITS),
            misses=counter(STAT_MISSES),
            saved_s=counter(STAT_SAVED_US) / 1e6,
            entries=len(entries),
            stored_bytes=sum(e.size_bytes for e in entries),
            size_limit_bytes=store.size_limit_bytes,
            evictions=counter(STAT_EVICTIONS),
            quarantined=counter(STAT_QUARANTINED),
        )
