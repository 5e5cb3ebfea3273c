"""The store's index: one row per entry, persistent counters and settings.

Rows are JSON-shaped dicts keyed by the blob hex; what a row must hold is
``records.entry_from_json``'s business, not the index's. The index is only a fast
path: every row repeats what its blob's sidecar says, so a lost row is rebuilt from
the sidecar.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import diskcache

ROW_PREFIX = "entry:"
SIZE_LIMIT_SETTING = "setting:size_limit_bytes"
STAT_HITS = "stat:hits"
STAT_MISSES = "stat:misses"
STAT_SAVED_US = "stat:saved_us"  # integer microseconds: diskcache.incr is exact on ints
STAT_EVICTIONS = "stat:evictions"
STAT_QUARANTINED = "stat:quarantined"
COUNTERS = (STAT_HITS, STAT_MISSES, STAT_SAVED_US, STAT_EVICTIONS, STAT_QUARANTINED)

# Failures of the storage itself (as opposed to bugs): the store fails open on these
# unless strict.
INDEX_ERRORS: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, diskcache.Timeout)


class Index:
    """Rows, counters and settings in a diskcache folder."""

    def __init__(self, folder: str) -> None:
        # eviction_policy none: diskcache must never drop our rows; the store evicts.
        self._cache: Any = diskcache.Cache(
            folder,
            eviction_policy="none",
            statistics=False,
            tag_index=False,
            size_limit=2**62,
            cull_limit=0,
        )

    def close(self) -> None:
        self._cache.close()

    # -- rows -------------------------------------------------------------------------

    def get_row(self, hex_: str) -> object | None:
        row: object | None = self._cache.get(ROW_PREFIX + hex_, default=None, retry=True)
        return row

    def set_row(self, hex_: str, row: dict[str, Any]) -> None:
        self._cache.set(ROW_PREFIX + hex_, row, retry=True)

    def add_row(self, hex_: str, row: dict[str, Any]) -> bool:
        """Insert unless a row exists; whether it was inserted."""
        return bool(self._cache.add(ROW_PREFIX + hex_, row, retry=True))

    def drop_row(self, hex_: str) -> bool:
        return bool(self._cache.delete(ROW_PREFIX + hex_, retry=True))

    def has_row(self, hex_: str) -> bool:
        return bool((ROW_PREFIX + hex_) in self._cache)

    def row_hexes(self) -> list[str]:
        return [
            k[len(ROW_PREFIX) :]
            for k in list(self._cache)
            if isinstance(k, str) and k.startswith(ROW_PREFIX)
        ]

    def touch(self, hex_: str, now_unix_s: float) -> None:
        """Set a row's access time (LRU), atomically with reading it."""
        with self._cache.transact(retry=True):
            row = self._cache.get(ROW_PREFIX + hex_, default=None)
            if isinstance(row, dict):
                self._cache.set(ROW_PREFIX + hex_, {**row, "accessed_unix_s": now_unix_s})

    # -- counters and settings -----------------------------------------------------------

    def bump(self, name: str, delta: int = 1) -> None:
        self._cache.incr(name, delta, default=0, retry=True)

    def counter(self, name: str) -> int:
        return int(self._cache.get(name, default=0, retry=True))

    def reset_counters(self) -> None:
        for name in COUNTERS:
            self._cache.delete(name, retry=True)

    def size_limit_bytes(self, default: int) -> int:
        return int(self._cache.get(SIZE_LIMIT_SETTING, default, retry=True))

    def set_size_limit_bytes(self, value: int) -> None:
        self._cache.set(SIZE_LIMIT_SETTING, int(value), retry=True)

    # -- self-check ---------------------------------------------------------------------

    def check(self, fix: bool) -> list[str]:
        """Problems of the index's own database; repaired when ``fix``."""
        problems = [f"index: {w.message}" for w in self._cache.check(fix=False, retry=True)]
        if fix and problems:
            # Only now: diskcache's fix runs VACUUM, which waits for other writers.
            self._cache.check(fix=True, retry=True)
        return problems
