"""The interface every level of the blob store implements (``BlobStorage``): a level hands
out only bytes that verify against their record and takes in only bytes that match
theirs; its own trust rules stay behind the calls. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ovspec.store.keys import BlobKey
from ovspec.store.records import BlobRecord, Verdict

__all__ = ["BlobRecord", "BlobStorage", "PutResult", "Verdict"]


@dataclass(frozen=True)
class PutResult:
    """What ``put`` did. ``stored``: this call's bytes and record are the level's now
    (False: another writer's were there first, and stay). ``moved_bytes``: payload
    bytes written (0 when the level had them already)."""

    stored: bool
    moved_bytes: int


class BlobStorage(Protocol):
    """One level of blob storage.

    Reads: ``contains`` is a cheap hint (nothing verified or counted); ``record`` is the
    level's record of a key, checked as far as the level checks records (the remote:
    the manifest names the key and, with keys, is signed) but the payload not read;
    ``get`` copies the payload to ``dest`` and returns its record only when the copied
    bytes verify. ``get`` raises ``BlobRefusedError`` when the level holds bytes that do
    not verify, or more than ``max_bytes`` of them; ``dest`` then holds nothing.

    Writes: ``put`` publishes the payload at ``source`` under ``key`` only if it hashes
    to ``record.checksum`` (else ``ValueError``, nothing stored); the first writer of a
    key wins and a later ``put`` returns ``stored=False``. A read-only level refuses
    ``put`` and ``remove`` with a ``StoreError``. Levels take no key locks: a producer
    that must run once per key runs under the front level's lock
    (``DiskStore.get_or_create``). A level that cannot be reached raises
    ``RemoteUnavailableError``.
    """

    @property
    def location(self) -> str:
        """Where the level is (a folder, a URL), for messages."""
        ...

    @property
    def read_only(self) -> bool:
        """Whether ``put`` and ``remove`` are refused here."""
        ...

    def contains(self, key: BlobKey) -> bool:
        """Whether the level names ``key`` (a hint: nothing is read or verified)."""
        ...

    def record(self, key: BlobKey) -> BlobRecord | None:
        """The level's record of ``key``; None if it has none."""
        ...

    def get(self, key: BlobKey, dest: Path, *, max_bytes: int | None = None) -> BlobRecord | None:
        """Write the verified payload of ``key`` to ``dest`` (a file the caller owns) and
        return its record; None if the level does not hold ``key``."""
        ...

    def put(self, key: BlobKey, source: Path, record: BlobRecord) -> PutResult:
        """Publish the payload at ``source`` (left in place) as ``key``."""
        ...

    def remove(self, hex_: str) -> bool:
        """Forget the key with this hex; whether there was one."""
        ...

    def hexes(self) -> Iterator[str]:
        """The hex of every key the level names (not verified)."""
        ...

    def verify(self, key: BlobKey) -> Verdict:
        """Check the stored payload of ``key`` against its record without handing it
        out (a level that can sets corrupt bytes aside)."""
        ...
