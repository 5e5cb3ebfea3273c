"""A conversation on a loader: tokens appended turn after turn, each turn prefilling only
its own, the KV, its rung and positions kept between turns; forks that share what came
before; what to do past the top rung (``Overflow``); a shared prefix taken from a
``PrefixCache`` instead of computed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from ovspec.errors import BadRequestError, arg
from ovspec.runtime.generation import StopReason, Streamer
from ovspec.runtime.loader import Loader
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.prefixcache import PrefixCache, Snapshot, saved_session, session_identity
from ovspec.runtime.sampling import GenerationConfig, TokenChooser
from ovspec.runtime.tracks import Track, open_track
from ovspec.store import sessions


class Overflow(Enum):
    """What a conversation does when its tokens would pass the top rung."""

    REFUSE = "refuse"  # one line, nothing changed
    # Keep the first ``keep_first_tokens`` and the most recent tokens that fill half of
    # the rest, and prefill them afresh: exactly a new conversation on the kept tokens.
    SLIDE = "slide"


@dataclass(frozen=True)
class Slide:
    """One slide: where it happened and the tokens kept."""

    at_tokens: int  # the conversation's length when it slid
    kept_ids: tuple[int, ...]


@dataclass(frozen=True)
class Turn:
    """What one ``generate`` did."""

    token_ids: tuple[int, ...]
    stop_reason: StopReason
    prefilled_tokens: int  # tokens this turn put into the KV before its first token
    reused_tokens: int  # of the conversation's tokens, taken from the prefix cache
    first_token_s: float  # from the call to the first token
    seconds: float
    capacity_tokens: int  # the rung at the end of the turn
    boundaries: int  # crossed during the turn
    slides: tuple[Slide, ...] = ()


class Conversation:
    """One sequence kept across turns on ``loader`` (either path).

    ``append`` adds token ids (``cache_prefix``: the conversation so far is a prefix worth
    keeping, e.g. a system prompt); ``generate`` answers, feeding only what the KV does not
    hold yet; ``fork`` copies the KV so a second branch shares the first's past.
    """

    def __init__(
        self,
        loader: Loader | PagedLoader,
        overflow: Overflow | str = Overflow.REFUSE,
        keep_first_tokens: int = 0,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.loader = loader
        self.ladder = loader.ladder
        self.overflow = Overflow(overflow)
        if not 0 <= keep_first_tokens < self.ladder.top_tokens // 2:
            raise BadRequestError(
                f"{arg('keep_first_tokens')} {keep_first_tokens} must be in "
                f"[0, {self.ladder.top_tokens // 2}) (half the top rung)"
            )
        self.keep_first_tokens = keep_first_tokens
        self.prefix_cache = prefix_cache
        self.tokens: list[int] = []  # everything said; the KV holds tokens[:live_tokens]
        self._marks: list[int] = []  # lengths at which the tokens are a cacheable prefix
        self._track: Track = open_track(loader)
        self.fed_tokens = 0  # tokens put into the KV by this conversation, ever

    # -- state --------------------------------------------------------------------

    @property
    def live_tokens(self) -> int:
        return self._track.live_tokens

    @property
    def capacity_tokens(self) -> int:
        return self._track.capacity_tokens

    @property
    def pending_tokens(self) -> int:
        """Tokens said but not yet in the KV (the next turn prefills them)."""
        return len(self.tokens) - self.live_tokens

    @property
    def track(self) -> Track:
        return self._track

    # -- turns --------------------------------------------------------------------

    def append(self, token_ids: Sequence[int], cache_prefix: bool = False) -> None:
        ids = [int(t) for t in token_ids]
        vocab = self.loader.vocab_tokens if isinstance(self.loader, PagedLoader) else None
        bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise BadRequestError(f"token id {bad[0]} is outside the model's vocabulary")
        self.tokens.extend(ids)
        if cache_prefix and self.tokens:
            self._marks.append(len(self.tokens))

    def rewind(self, length_tokens: int) -> None:
        """Forget everything after the first ``length_tokens`` (the KV too)."""
        if not 0 <= length_tokens <= len(self.tokens):
            raise BadRequestError(f"cannot rewind to {length_tokens} of {len(self.tokens)} tokens")
        del self.tokens[length_tokens:]
        self._marks = [m for m in self._marks if m <= length_tokens]
        if self.live_tokens > length_tokens:
            self._track.truncate(length_tokens)

    def reset(self) -> None:
        self.rewind(0)

    def generate(self, config: GenerationConfig, streamer: Streamer | None = None) -> Turn:
        """Answer what was appended: its tokens are prefilled, then up to
        ``config.max_new_tokens`` are chosen as ``generate`` chooses them (greedy or
        sampled, EOS and stop ids, a streamer that may stop it). The last token chosen
        stays pending: the next turn feeds it first, as one generate over the whole
        conversation would."""
        if config.stop_strings:
            raise BadRequestError(
                "a conversation stops on token ids; stop strings are not supported"
            )
        if not self.pending_tokens:
            raise BadRequestError("nothing to answer: append a message or token ids first")
        began = time.perf_counter()
        boundaries_before = len(self._track.boundaries)
        slides: list[Slide] = []
        fed_before = self.fed_tokens
        reused = self._reuse_prefix()
        logits = self._feed_pending(slides)
        prefilled = self.fed_tokens - fed_before
        first_token_s = time.perf_counter() - began
        chooser = TokenChooser(config, self.tokens)
        stop_ids = config.stop_ids
        generated: list[int] = []
        reason = StopReason.MAX_NEW_TOKENS
        while True:
            token = chooser(logits)
            generated.append(token)
            self.tokens.append(token)
            if streamer is not None and streamer(token):
                reason = StopReason.STREAMER
                break
            if token in stop_ids:
                reason = StopReason.EOS
                break
            if len(generated) == config.max_new_tokens:
                break
            logits = self._feed_pending(slides)
        return Turn(
            token_ids=tuple(generated),
            stop_reason=reason,
            prefilled_tokens=prefilled,
            reused_tokens=reused,
            first_token_s=first_token_s,
            seconds=time.perf_counter() - began,
            capacity_tokens=self.capacity_tokens,
            boundaries=len(self._track.boundaries) - boundaries_before,
            slides=tuple(slides),
        )

    def fork(self) -> Conversation:
        """A second conversation with the same tokens and a copy of the KV (nothing
        recomputed); the two go their own ways from here."""
        twin = Conversation(self.loader, self.overflow, self.keep_first_tokens, self.prefix_cache)
        twin._track.close()
        twin._track = self._track.fork()
        twin.tokens = list(self.tokens)
        twin._marks = list(self._marks)
        return twin

    def snapshot(self) -> Snapshot:
        """The tokens and the live KV, copied (what is saved and restored)."""
        return Snapshot(tuple(self.tokens), self.live_tokens, self._track.export_kv())

    def restore(self, snapshot: Snapshot) -> None:
        """Take ``snapshot``'s tokens and KV in place of this conversation's."""
        self._track.close()
        self._track = open_track(self.loader)
        if snapshot.live_tokens:
            self._track.import_kv(snapshot.arrays, snapshot.live_tokens)
        self.tokens = list(snapshot.tokens)
        self._marks = []

    def save(self, path: Path, notes: Mapping[str, object] | None = None) -> int:
        """Write the tokens, the live KV and ``notes`` to ``path`` (atomically); the bytes."""
        saved = saved_session(self.snapshot(), self.identity(), notes or {})
        return sessions.write_file(path, saved)

    def load(self, path: Path) -> Mapping[str, object]:
        """Continue the conversation saved in ``path`` (verified, and refused in one line
        if damaged or saved for another model or graph); its notes."""
        saved = sessions.read_file(path, self.identity())
        self.restore(Snapshot(saved.tokens, saved.live_tokens, saved.arrays))
        return saved.notes

    def identity(self) -> dict[str, str]:
        """What this conversation's KV depends on (a saved one must match it)."""
        return session_identity(self.loader, self._track)

    def close(self) -> None:
        self._track.close()

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- feeding the KV -------------------------------------------------------------

    def _reuse_prefix(self) -> int:
        """At an empty KV, the longest marked prefix the cache holds goes in as it is."""
        cache = self.prefix_cache
        if cache is None or self.live_tokens or not self._marks:
            return 0
        identity = self.identity()
        for mark in sorted(self._marks, reverse=True):
            if mark > self.ladder.top_tokens:
                continue
            found = cache.lookup(identity, self.tokens[:mark])
            if found is not None:
                self._track.import_kv(found.arrays, found.live_tokens)
                return mark
        return 0

    def _feed_pending(self, slides: list[Slide]) -> np.ndarray:
        """Put every pending token into the KV (marked prefixes stored on the way); the
        last one's logits. Past the top rung the overflow policy decides."""
        if len(self.tokens) > self.ladder.top_tokens:
            return self._overflow(slides)
        live = self.live_tokens
        pending = self.tokens[live:]
        if len(pending) == 1 and live:
            self.fed_tokens += 1
            return self._track.step(pending[0])
        logits = np.empty(0, np.float32)
        for mark in sorted(m for m in self._marks if m > self.live_tokens):
            logits = self._extend(self.tokens[self.live_tokens : mark])
            if self.prefix_cache is not None:
                self.prefix_cache.add(self.identity(), self.snapshot_at(mark))
        if self.live_tokens < len(self.tokens):
            logits = self._extend(self.tokens[self.live_tokens :])
        return logits

    def _extend(self, token_ids: Sequence[int]) -> np.ndarray:
        self.fed_tokens += len(token_ids)
        return self._track.extend(token_ids)

    def snapshot_at(self, length_tokens: int) -> Snapshot:
        """The snapshot of the first ``length_tokens``, all of them live."""
        if self.live_tokens != length_tokens:
            raise BadRequestError(f"the KV holds {self.live_tokens} tokens, not {length_tokens}")
        return Snapshot(tuple(self.tokens[:length_tokens]), length_tokens, self._track.export_kv())

    def _overflow(self, slides: list[Slide]) -> np.ndarray:
        top = self.ladder.top_tokens
        if self.overflow is Overflow.REFUSE:
            raise BadRequestError(
                f"the conversation has {len(self.tokens)} tokens, over the top rung {top}; "
                f"extend {arg('ladder')}, start a new one, or let it slide "
                f"({arg('overflow', 'slide')})"
            )
        keep = self.keep_first_tokens
        recent = (top - keep) // 2
        kept = self.tokens[:keep] + self.tokens[-recent:]
        slides.append(Slide(len(self.tokens), tuple(kept)))
        self._track.truncate(0)
        self.tokens = kept
        self._marks = [m for m in self._marks if m <= keep]
        return self._extend(kept)
