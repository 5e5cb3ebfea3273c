"""The persistent, content-addressed blob store and what names its blobs.

Keys and digests; the interface every level implements (``storage``); the local folder
(``disk``), the S3 remote (``remote``), both composed (``tier``); ``Store`` (``local``).
"""

from __future__ import annotations

__all__ = ["Store"]


def __getattr__(name: str) -> object:
    # ``from ovspec.store import Store`` is public; importing ovspec.store.keys alone
    # should not open the index's modules.
    if name == "Store":
        from ovspec.store.local import Store

        return Store
    raise AttributeError(f"module 'ovspec.store' has no attribute {name!r}")
