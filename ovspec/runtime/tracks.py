"""A conversation's KV on either path, behind one ``Track``: extend it by tokens (turn N
prefills only its own), step it, rewind it, fork it, and export or import its live part
as plain arrays. ``PagedTrack`` is CPU's paged graph; ``RungTrack`` the rung graphs (the
NPU's way), whose later turns feed the rung's decode graph token by token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from ovspec.errors import LadderError
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.blockkv import BLOCK_TOKENS
from ovspec.runtime.kv import KVCache, choose_layout, make_kv
from ovspec.runtime.kvcache import seq_slice
from ovspec.runtime.loader import Loader
from ovspec.runtime.options import DEFAULT_PREFILL_CHUNK_TOKENS
from ovspec.runtime.paged import PagedLoader, PagedSequence
from ovspec.runtime.session import BoundaryRecord, DecodeSession


class Track(Protocol):
    """One sequence's KV that a conversation keeps between turns."""

    ladder: Ladder

    @property
    def live_tokens(self) -> int: ...

    @property
    def capacity_tokens(self) -> int: ...

    @property
    def boundaries(self) -> list[BoundaryRecord]: ...

    def extend(self, token_ids: Sequence[int]) -> np.ndarray:
        """Put ``token_ids`` after the live tokens; the last one's logits."""
        ...

    def step(self, token_id: int) -> np.ndarray: ...

    def truncate(self, live_tokens: int) -> None:
        """Keep the first ``live_tokens`` only."""
        ...

    def fork(self) -> Track:
        """A second track holding a copy of this one's live KV."""
        ...

    def export_kv(self) -> dict[str, np.ndarray]:
        """The live part of every KV array, copied (what a saved session holds)."""
        ...

    def import_kv(self, arrays: Mapping[str, np.ndarray], live_tokens: int) -> None:
        """Replace an empty track's KV by ``arrays`` holding ``live_tokens``."""
        ...

    def kv_description(self) -> str:
        """Names, shapes and types of the KV arrays: part of a saved session's key."""
        ...

    def close(self) -> None: ...


def open_track(loader: Loader | PagedLoader) -> Track:
    """An empty track on ``loader``'s path."""
    if isinstance(loader, PagedLoader):
        return PagedTrack(loader)
    return RungTrack(loader)


def _check_shapes(
    expected: Mapping[str, tuple[tuple[int, ...], str]], arrays: Mapping[str, np.ndarray]
) -> None:
    if set(expected) != set(arrays):
        raise LadderError(f"the KV arrays are {sorted(arrays)}, expected {sorted(expected)}")
    for name, (shape, dtype) in expected.items():
        got = arrays[name]
        if tuple(got.shape) != shape or got.dtype.str != dtype:
            raise LadderError(
                f"KV array {name} is {got.dtype.str}{list(got.shape)}, "
                f"expected {dtype}{list(shape)}"
            )


class PagedTrack:
    """The paged graph's sequence: a turn's tokens go in as prefill chunks on the live
    blocks; rewinding only lowers the live length (later writes overwrite the rest)."""

    def __init__(self, loader: PagedLoader, capacity_tokens: int | None = None) -> None:
        self._loader = loader
        self.ladder = loader.ladder
        self._capacity = capacity_tokens or self.ladder.capacities_tokens[0]
        self._sequence: PagedSequence | None = None

    def _seq(self) -> PagedSequence:
        if self._sequence is None:
            self._sequence = self._loader.sequence(self._capacity)
        return self._sequence

    @property
    def live_tokens(self) -> int:
        return 0 if self._sequence is None else self._sequence.kv.live_tokens

    @property
    def capacity_tokens(self) -> int:
        return self._capacity if self._sequence is None else self._sequence.kv.capacity_tokens

    @property
    def boundaries(self) -> list[BoundaryRecord]:
        return [] if self._sequence is None else self._sequence.boundaries

    def extend(self, token_ids: Sequence[int]) -> np.ndarray:
        if self._sequence is None:
            self._capacity = self.ladder.rung_for(len(token_ids))
        return self._seq().prefill(token_ids)

    def step(self, token_id: int) -> np.ndarray:
        return self._seq().step(token_id)

    def truncate(self, live_tokens: int) -> None:
        if not 0 <= live_tokens <= self.live_tokens:
            raise LadderError(f"cannot keep {live_tokens} of {self.live_tokens} live tokens")
        if self._sequence is not None:
            self._sequence.kv.live_tokens = live_tokens

    def fork(self) -> PagedTrack:
        twin = PagedTrack(self._loader, self.capacity_tokens)
        if self.live_tokens:
            twin.import_kv(self.export_kv(), self.live_tokens)
        return twin

    def export_kv(self) -> dict[str, np.ndarray]:
        blocks = math.ceil(self.live_tokens / BLOCK_TOKENS)
        arrays = self._seq().kv.arrays()
        return {name: np.array(a[:blocks], copy=True) for name, a in arrays.items()}

    def import_kv(self, arrays: Mapping[str, np.ndarray], live_tokens: int) -> None:
        if self.live_tokens:
            raise LadderError("KV is imported into an empty sequence only")
        needed = self.ladder.rung_for(max(live_tokens, 1))
        if self._sequence is None:
            self._capacity = max(self._capacity, needed)
        seq = self._seq()
        if needed > seq.kv.capacity_tokens:
            seq.grow_to(needed)
        blocks = math.ceil(live_tokens / BLOCK_TOKENS)
        own = seq.kv.arrays()
        _check_shapes({n: ((blocks, a.shape[1]), a.dtype.str) for n, a in own.items()}, arrays)
        for name, array in arrays.items():
            own[name][:blocks] = array
        seq.kv.live_tokens = live_tokens

    def kv_description(self) -> str:
        arrays = self._seq().kv.arrays()
        parts = [f"{n}:{a.shape[1]}B/{BLOCK_TOKENS}" for n, a in sorted(arrays.items())]
        return "paged " + ",".join(parts)

    def close(self) -> None:
        if self._sequence is not None:
            self._sequence.close()
            self._sequence = None


class RungTrack:
    """A ``DecodeSession`` over rung graphs kept between turns. The first tokens go through
    the prompt rung's prefill graph; a later turn's tokens through the current rung's
    decode graph one at a time (crossing boundaries as decoding does), so a conversation
    needs no prefill graph beyond the first rung's."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self.ladder = loader.ladder
        self._roles: ModelRoles | None = None
        self._session: DecodeSession | None = None
        self._kv: KVCache | None = None

    def _open(self, capacity_tokens: int) -> DecodeSession:
        if self._session is None:
            loader = self._loader
            roles = loader.roles(Specialization.decode(capacity_tokens))
            layout = choose_layout(loader.kv_layout, roles, self.ladder).layout
            self._roles = roles
            self._kv = make_kv(
                layout, roles, capacity_tokens, self.ladder.top_tokens, None, self.ladder
            )
            chunk = loader.prefill_chunk_tokens or DEFAULT_PREFILL_CHUNK_TOKENS
            # Graphs stay loaded: a fork or a prefix may come back to a smaller rung.
            self._session = DecodeSession(
                roles, self.ladder, self._kv, loader, chunk, loader.origin_s
            )
        return self._session

    @property
    def live_tokens(self) -> int:
        return 0 if self._kv is None else self._kv.live_tokens

    @property
    def capacity_tokens(self) -> int:
        return self.ladder.capacities_tokens[0] if self._kv is None else self._kv.capacity_tokens

    @property
    def boundaries(self) -> list[BoundaryRecord]:
        return [] if self._session is None else self._session.boundaries

    def extend(self, token_ids: Sequence[int]) -> np.ndarray:
        if not token_ids:
            raise LadderError("nothing to extend the KV with")
        if self.live_tokens == 0:
            first = self.ladder.rung_for(len(token_ids))
            self._loader.start(first)
            return self._open(first).prefill(token_ids)
        session = self._open(self.capacity_tokens)
        logits = np.empty(0, np.float32)
        for token in token_ids:
            logits = session.step(int(token))
        return logits

    def step(self, token_id: int) -> np.ndarray:
        return self._open(self.capacity_tokens).step(token_id)

    def truncate(self, live_tokens: int) -> None:
        if self._session is not None:
            self._session.truncate(live_tokens)
        elif live_tokens:
            raise LadderError(f"cannot keep {live_tokens} of 0 live tokens")

    def fork(self) -> RungTrack:
        twin = RungTrack(self._loader)
        if self.live_tokens:
            twin.import_kv(self.export_kv(), self.live_tokens)
        return twin

    def _views(self) -> dict[str, tuple[np.ndarray, tuple[slice, ...]]]:
        assert self._kv is not None and self._roles is not None
        arrays = self._kv.arrays()
        live = self._kv.live_tokens
        return {r.past_input: (arrays[r.past_input], seq_slice(r, 0, live)) for r in self._roles.kv}

    def export_kv(self) -> dict[str, np.ndarray]:
        if self._kv is None:
            return {}
        return {name: np.array(a[where], copy=True) for name, (a, where) in self._views().items()}

    def import_kv(self, arrays: Mapping[str, np.ndarray], live_tokens: int) -> None:
        if self.live_tokens:
            raise LadderError("KV is imported into an empty sequence only")
        capacity = self.ladder.rung_for(max(live_tokens, 1))
        self._loader.start(capacity)
        session = self._open(capacity)
        assert self._kv is not None and self._roles is not None
        if capacity > self._kv.capacity_tokens:
            self._kv.grow(capacity)
        self._kv.live_tokens = live_tokens
        views = self._views()
        _check_shapes({n: (a[w].shape, a.dtype.str) for n, (a, w) in views.items()}, arrays)
        for name, (array, where) in views.items():
            array[where] = arrays[name]
        session.truncate(live_tokens)  # the decode request binds again over the new KV

    def kv_description(self) -> str:
        roles = self._roles or self._loader.roles(Specialization.decode(self.capacity_tokens))
        parts = [
            f"{r.past_input}:{list(r.shape_template)}@{r.seq_axis}:{r.element_type.get_type_name()}"
            for r in roles.kv
        ]
        return "rungs " + ",".join(parts)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._kv is not None:
            self._kv.close()
            self._kv = None
