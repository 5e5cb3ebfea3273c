"""The persistent, content-addressed blob store and what names its blobs.

Owns blob keys (named components), file digests, and the local store: index, payload
I/O, per-key locks and maintenance. Imports only the primitives; never OpenVINO.
A remote tier lands here, behind the same interface as the local one.
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
