"""A shared prefix's KV computed once: snapshots of a conversation's first tokens kept in
memory and in the store (so through its remote tier too), found by the tokens and by what
the KV depends on (``session_identity``: the model's files, the graphs' key components,
the KV's arrays).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov

from ovspec.errors import BadRequestError, OvspecError
from ovspec.ir.specialize import Specialization
from ovspec.runtime.loader import Loader
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.tracks import Track
from ovspec.store import sessions
from ovspec.store.keys import BlobKey, canonical_mapping
from ovspec.store.local import Store
from ovspec.store.records import ProducedBlob


@dataclass(frozen=True)
class Snapshot:
    """A conversation's tokens and its KV over the first ``live_tokens`` of them."""

    tokens: tuple[int, ...]
    live_tokens: int
    arrays: Mapping[str, np.ndarray]


def session_identity(loader: Loader | PagedLoader, track: Track) -> dict[str, str]:
    """What a KV computed on ``loader`` depends on, as key components: a rung loader's
    blob key components (model, compression, rewrites, device, OpenVINO, properties...),
    the paged graph's own; the KV arrays' description as the specialization."""
    if isinstance(loader, PagedLoader):
        if loader.model_dir is None or loader.store is None:
            raise OvspecError("this paged loader was opened without its model folder")
        memo = loader.store.digest_memo()
        values = {
            "ir_structure": memo.digest(loader.model_dir.xml_path),
            "weights": memo.digest(loader.model_dir.bin_path),
            "transforms": "paged-attention",
            "device": loader.device,
            "openvino": ov.get_version(),
            "properties": canonical_mapping(loader.properties.items()),
        }
    else:
        # The compiler's key is the loader's to ask (one call, nothing compiled).
        key = loader._compiler.key(Specialization.decode(loader.ladder.top_tokens))
        values = key.values()
    values["specialization"] = track.kv_description()
    values.pop("format", None)
    return values


def saved_session(
    snapshot: Snapshot, identity: Mapping[str, str], notes: Mapping[str, object]
) -> sessions.SavedSession:
    return sessions.SavedSession(
        identity, snapshot.tokens, snapshot.live_tokens, snapshot.arrays, notes
    )


class _Miss(Exception):
    """The store has no such prefix (raised by a producer so nothing is stored)."""


class PrefixCache:
    """Prefix snapshots in memory (the ``memory_entries`` last used) and, given a store, in
    it under ``sessions.session_key``. A hit is the stored KV itself: exactly what
    computing the prefix again would give on the same graphs."""

    def __init__(self, store: Store | None = None, memory_entries: int = 8) -> None:
        self.store = store
        self.memory_entries = memory_entries
        self._memory: OrderedDict[str, Snapshot] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def lookup(self, identity: Mapping[str, str], tokens: Sequence[int]) -> Snapshot | None:
        key = sessions.session_key(identity, tokens)
        with self._lock:
            found = self._memory.get(key.hex)
            if found is not None:
                self._memory.move_to_end(key.hex)
                self.hits += 1
                return found
        found = self._from_store(key, identity, tokens)
        with self._lock:
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._remember(key.hex, found)
        return found

    def add(self, identity: Mapping[str, str], snapshot: Snapshot) -> None:
        key = sessions.session_key(identity, snapshot.tokens)
        with self._lock:
            self._remember(key.hex, snapshot)
        if self.store is None or self.store.peek(key):
            return
        saved = saved_session(snapshot, identity, {})

        def produce(path: Path) -> ProducedBlob:
            began = time.perf_counter()
            size = sessions.write_file(path, saved)
            return ProducedBlob(time.perf_counter() - began, {"kind": "prefix"}, size)

        outcome = self.store.get_or_create(key, produce)
        if not outcome.stored:
            outcome.discard()

    def _remember(self, hex_: str, snapshot: Snapshot) -> None:
        self._memory[hex_] = snapshot
        self._memory.move_to_end(hex_)
        while len(self._memory) > self.memory_entries:
            self._memory.popitem(last=False)

    def _from_store(
        self, key: BlobKey, identity: Mapping[str, str], tokens: Sequence[int]
    ) -> Snapshot | None:
        store = self.store
        if store is None:
            return None
        entry = store.lookup(key)
        if entry is not None:
            path = entry.path
        elif store.tier is not None:
            try:
                outcome = store.get_or_create(key, _refuse)  # the remote, else nothing
            except _Miss:
                return None
            path = outcome.path
        else:
            return None
        try:
            saved = sessions.read_file(path, identity)
        except BadRequestError:
            return None  # verified by the store, refused here: another format; compute it
        if saved.tokens != tuple(tokens):
            return None
        return Snapshot(saved.tokens, saved.live_tokens, saved.arrays)


def _refuse(path: Path) -> ProducedBlob:
    raise _Miss
