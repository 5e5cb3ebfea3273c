"""Reading what a store holds without changing it: a cheap "would this hit?", finding
an entry by a key prefix, and the statistics. Nothing here hashes, counts or touches.
"""

from __future__ import annotations

import contextlib

from ovspec.errors import StoreError
from ovspec.store import index as counters
from ovspec.store.core import StoreCore
from ovspec.store.index import (
    INDEX_ERRORS,
    STAT_EVICTIONS,
    STAT_HITS,
    STAT_MISSES,
    STAT_QUARANTINED,
    STAT_SAVED_US,
)
from ovspec.store.keys import BlobKey
from ovspec.store.records import RemoteStats, StoreEntry, StoreStats


def peek(store: StoreCore, key: BlobKey) -> bool:
    """Whether ``key`` looks stored (a row naming it and a payload of its size), without
    hashing, counting or touching anything: a cheap "would this hit?". ``lookup``
    still verifies before anything is used."""
    try:
        entry = store.row(key.hex)
    except (ValueError, *INDEX_ERRORS):  # type: ignore[misc]
        return False
    if entry is None or entry.components != key.components:
        return False
    try:
        return entry.path.stat().st_size == entry.size_bytes
    except OSError:
        return False


def entries(store: StoreCore) -> list[StoreEntry]:
    """Every well-formed index row, most recently used first (not verified)."""
    out: list[StoreEntry] = []
    with store.locked_io("list the entries"):
        for hex_ in store.index.row_hexes():
            with contextlib.suppress(ValueError):  # a malformed row: check() reports it
                entry = store.row(hex_)
                if entry is not None:
                    out.append(entry)
    out.sort(key=lambda e: (e.accessed_unix_s, e.created_unix_s), reverse=True)
    return out


def find(store: StoreCore, prefix: str) -> StoreEntry:
    """The entry whose hex starts with ``prefix``; StoreError if none or several."""
    needle = prefix.strip().lower()
    if not needle:
        raise StoreError("empty key prefix; give the first hex digits of an entry")
    matches = [e for e in entries(store) if e.hex.startswith(needle)]
    if not matches:
        raise StoreError(f"no entry matches {prefix!r}; see `ovspec cache ls`")
    if len(matches) > 1:
        shown = ", ".join(e.hex[:12] for e in matches[:4])
        raise StoreError(
            f"prefix {prefix!r} is ambiguous: it matches {len(matches)} entries "
            f"({shown}); give more digits"
        )
    return matches[0]


def stats(store: StoreCore) -> StoreStats:
    with store.locked_io("read statistics"):
        found = entries(store)
        counter = store.index.counter
        return StoreStats(
            hits=counter(STAT_HITS),
            misses=counter(STAT_MISSES),
            saved_s=counter(STAT_SAVED_US) / 1e6,
            entries=len(found),
            stored_bytes=sum(e.size_bytes for e in found),
            size_limit_bytes=store.size_limit_bytes,
            evictions=counter(STAT_EVICTIONS),
            quarantined=counter(STAT_QUARANTINED),
            remote=RemoteStats(
                hits=counter(counters.STAT_REMOTE_HITS),
                misses=counter(counters.STAT_REMOTE_MISSES),
                refused=counter(counters.STAT_REMOTE_REFUSED),
                failures=counter(counters.STAT_REMOTE_FAILURES),
                fetched_bytes=counter(counters.STAT_REMOTE_FETCHED_BYTES),
                fetch_s=counter(counters.STAT_REMOTE_FETCH_US) / 1e6,
                saved_compile_s=counter(counters.STAT_REMOTE_SAVED_US) / 1e6,
                uploads=counter(counters.STAT_REMOTE_UPLOADS),
                uploaded_bytes=counter(counters.STAT_REMOTE_UPLOADED_BYTES),
                upload_s=counter(counters.STAT_REMOTE_UPLOAD_US) / 1e6,
            ),
        )
