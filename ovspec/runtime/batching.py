"""Continuous batching on the paged graph: several sequences in one infer per step.

Owns the sequences of a batch and their scheduling: a request waits until a slot is free
and its worst-case KV fits the budget, joins with its prompt in chunks (aligned as
``decode`` chunks it, so its tokens are its batch-1 tokens) while the others decode,
and leaves at EOS, its token limit, a stop its callback asks for, or a cancel, giving
its blocks back to the shared ``BlockPool``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ovspec.errors import BadRequestError, arg
from ovspec.ir import paged as graph
from ovspec.runtime.blockkv import cache_layouts
from ovspec.runtime.blockpool import BlockPool, blocks_for, reservation_schedule
from ovspec.runtime.decoding import check_prompt_ids
from ovspec.runtime.kvcache import Migration
from ovspec.runtime.paged import BoundInputs, PagedLoader
from ovspec.runtime.sampling import GenerationConfig, TokenChooser

# Called with each generated token once chosen; returning True ends the sequence.
TokenCallback = Callable[[int], bool | None]


class Finish(Enum):
    """Why a sequence left the batch."""

    EOS = "eos"  # a stop token id (the model's EOS or the config's stop ids)
    MAX_NEW_TOKENS = "max_new_tokens"
    STOPPED = "stopped"  # its callback asked (a stop string, a streamer)
    CANCELLED = "cancelled"  # cancel(): a client went away, a shutdown


@dataclass(frozen=True)
class BatchRequest:
    """One sequence to run: its prompt and its generation settings."""

    prompt_ids: tuple[int, ...]
    config: GenerationConfig

    @property
    def worst_kv_tokens(self) -> int:
        """The KV positions it may fill: greedy decoding never feeds its last token."""
        return len(self.prompt_ids) + self.config.max_new_tokens - 1


@dataclass(frozen=True)
class TokenEvent:
    """What a step did for one sequence: a new token, its end, or both."""

    sequence_id: int
    token_id: int | None
    finish: Finish | None = None


@dataclass(frozen=True)
class BatchStep:
    """One infer of the batch: who was in it and what it held."""

    began_s: float  # seconds since the loader's origin
    infer_s: float
    sequences: int
    new_tokens: int  # tokens in the call: prompt chunks plus one per decoding sequence
    prefill_tokens: int
    capacity_tokens: int  # the pool's reservation during the call
    reserved_bytes: int
    used_blocks: int


@dataclass(frozen=True)
class PoolGrowth:
    """A reservation boundary of the shared pool: when, and what it cost."""

    began_s: float
    migration: Migration


@dataclass
class _Sequence:
    id: int
    request: BatchRequest
    chooser: TokenChooser
    on_token: TokenCallback | None
    blocks: list[int] = field(default_factory=list)
    live_tokens: int = 0  # KV positions written
    generated: list[int] = field(default_factory=list)

    @property
    def prompt_left(self) -> int:
        return len(self.request.prompt_ids) - self.live_tokens


class ContinuousBatcher:
    """Runs requests as one batch on ``loader``'s batched paged graph, a step at a time.

    Not thread-safe: one thread calls ``submit``, ``cancel`` and ``step`` (a server puts
    them behind its own lock or queue). ``max_sequences`` live at once; the KV pool is
    reserved along the ladder, then doubled up to ``kv_budget_tokens`` (default: the top
    rung per sequence), and a request joins only when its worst case fits beside the
    others' worst cases, so a running sequence never waits for blocks.
    """

    def __init__(
        self,
        loader: PagedLoader,
        max_sequences: int = 4,
        kv_budget_tokens: int | None = None,
    ) -> None:
        if max_sequences < 1:
            raise BadRequestError(f"{arg('max_sequences')} must be at least 1, got {max_sequences}")
        self.ladder = loader.ladder
        self.chunk_tokens = loader.prefill_chunk_tokens
        self.max_sequences = max_sequences
        budget = kv_budget_tokens or self.ladder.top_tokens * max_sequences
        schedule = reservation_schedule(self.ladder, budget)
        self.budget_blocks = blocks_for(schedule[-1])
        compiled = loader.batched_graph()
        self.vocab_tokens = loader.vocab_tokens
        self.pool = BlockPool(cache_layouts(compiled), schedule)
        self._request = compiled.create_infer_request()
        self._inputs = BoundInputs(self._request)  # the small per-call inputs
        self._bind_pool()
        self._origin_s = loader.origin_s
        self._next_id = 0
        self._waiting: deque[_Sequence] = deque()
        self._live: list[_Sequence] = []
        self._cancelled: set[int] = set()
        self.steps: list[BatchStep] = []
        self.growths: list[PoolGrowth] = []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._live

    def submit(self, request: BatchRequest, on_token: TokenCallback | None = None) -> int:
        """Queue ``request``; its id. A prompt the model or the ladder cannot take is a
        ``BadRequestError`` here, before it waits."""
        self.check(request)
        sequence = _Sequence(
            self._next_id, request, TokenChooser(request.config, request.prompt_ids), on_token
        )
        self._next_id += 1
        self._waiting.append(sequence)
        return sequence.id

    def check(self, request: BatchRequest) -> None:
        """Refuse a request the model or the ladder cannot take (``BadRequestError``);
        reads only what never changes, so any thread may call it."""
        check_prompt_ids(request.prompt_ids, self.vocab_tokens, self.ladder.top_tokens)
        if request.worst_kv_tokens > self.ladder.top_tokens:
            raise BadRequestError(
                f"{len(request.prompt_ids)} prompt tokens and up to "
                f"{request.config.max_new_tokens} new ones need {request.worst_kv_tokens} KV "
                f"positions, over the top rung {self.ladder.top_tokens}; lower "
                f"{arg('max_new_tokens')} or extend {arg('ladder')}"
            )

    def cancel(self, sequence_id: int) -> None:
        """End a waiting or running sequence at the next step (its blocks go back)."""
        self._cancelled.add(sequence_id)

    def step(self) -> list[TokenEvent]:
        """Drop the cancelled, admit who fits, run one infer over every live sequence;
        the events of this step (new tokens and finishes)."""
        events = self._drop_cancelled()
        self._admit()
        if not self._live:
            return events
        chunks = [self._next_tokens(s) for s in self._live]
        for sequence, tokens in zip(self._live, chunks, strict=True):
            self._reserve(sequence, sequence.live_tokens + len(tokens))
        logits = self._infer(chunks)
        leaving = []
        for row, (sequence, tokens) in enumerate(zip(self._live, chunks, strict=True)):
            sequence.live_tokens += len(tokens)
            if sequence.prompt_left > 0:
                continue  # more prompt chunks to go: this row's logits are not read
            finish = self._choose(sequence, logits[row])
            events.append(TokenEvent(sequence.id, sequence.generated[-1], finish))
            if finish is not None:
                leaving.append(sequence)
        for sequence in leaving:
            self._leave(sequence)
        return events

    def run(self) -> list[TokenEvent]:
        """Step until no sequence waits or runs; every event in order."""
        events: list[TokenEvent] = []
        while not self.idle:
            events.extend(self.step())
        return events

    def close(self) -> None:
        for sequence in [*self._live, *self._waiting]:
            self._cancelled.add(sequence.id)
        self._drop_cancelled()
        self.pool.close()

    def _drop_cancelled(self) -> list[TokenEvent]:
        if not self._cancelled:
            return []
        gone = [s for s in [*self._live, *self._waiting] if s.id in self._cancelled]
        self._waiting = deque(s for s in self._waiting if s.id not in self._cancelled)
        for sequence in gone:
            if sequence in self._live:
                self._leave(sequence)
        self._cancelled.clear()
        return [TokenEvent(s.id, None, Finish.CANCELLED) for s in gone]

    def _admit(self) -> None:
        """First come, first served: the head waits until a slot is free and its worst
        case fits beside the live sequences' worst cases (no later request overtakes it)."""
        while self._waiting and len(self._live) < self.max_sequences:
            head = self._waiting[0]
            promised = sum(blocks_for(s.request.worst_kv_tokens) for s in self._live)
            if promised + blocks_for(head.request.worst_kv_tokens) > self.budget_blocks:
                return
            self._live.append(self._waiting.popleft())

    def _next_tokens(self, sequence: _Sequence) -> Sequence[int]:
        """The next prompt chunk (aligned to ``chunk_tokens`` from the prompt's start, as
        ``decode`` cuts it) or the last generated token."""
        if sequence.prompt_left > 0:
            start = sequence.live_tokens
            return sequence.request.prompt_ids[start : start + self.chunk_tokens]
        return sequence.generated[-1:]

    def _reserve(self, sequence: _Sequence, tokens: int) -> None:
        missing = blocks_for(tokens) - len(sequence.blocks)
        if missing <= 0:
            return
        began = time.perf_counter()
        taken, migration = self.pool.take(missing)
        sequence.blocks.extend(taken)
        if migration is not None:
            self.growths.append(PoolGrowth(began - self._origin_s, migration))

    def _bind_pool(self) -> None:
        for name, tensor in self.pool.tensors().items():
            self._request.set_tensor(name, tensor)
        self._bound_version = self.pool.arrays_version

    def _infer(self, chunks: list[Sequence[int]]) -> np.ndarray:
        """One call over every live sequence's tokens; one logits row per sequence."""
        ids: list[int] = []
        positions: list[int] = []
        past, begins, block_ids, block_begins, last_rows = [], [0], [], [0], []
        for sequence, tokens in zip(self._live, chunks, strict=True):
            live = sequence.live_tokens
            ids.extend(tokens)
            positions.extend(range(live, live + len(tokens)))
            past.append(live)
            begins.append(begins[-1] + len(tokens))
            blocks = sequence.blocks[: blocks_for(live + len(tokens))]
            block_ids.extend(blocks)
            block_begins.append(block_begins[-1] + len(blocks))
            last_rows.append(begins[-1] - 1)
        longest = max(s.live_tokens + len(t) for s, t in zip(self._live, chunks, strict=True))
        if self._bound_version != self.pool.arrays_version:
            self._bind_pool()  # the pool grew or shrank: its arrays moved
        r, put = self._request, self._inputs.put
        put(graph.INPUT_IDS, np.asarray(ids, np.int64))
        put(graph.POSITION_IDS, np.asarray(positions, np.int64))
        put(graph.PAST_LENS, np.asarray(past, np.int32))
        put(graph.SUBSEQUENCE_BEGINS, np.asarray(begins, np.int32))
        put(graph.BLOCK_INDICES, np.asarray(block_ids, np.int32))
        put(graph.BLOCK_INDICES_BEGINS, np.asarray(block_begins, np.int32))
        put(graph.MAX_CONTEXT_LEN, np.array(longest, np.int32))
        put(graph.LOGITS_INDICES, np.asarray(last_rows, np.int64))
        began = time.perf_counter()
        r.infer()
        infer_s = time.perf_counter() - began
        prefill = sum(len(t) for s, t in zip(self._live, chunks, strict=True) if s.prompt_left > 0)
        self.steps.append(
            BatchStep(
                began_s=began - self._origin_s,
                infer_s=infer_s,
                sequences=len(chunks),
                new_tokens=len(ids),
                prefill_tokens=prefill,
                capacity_tokens=self.pool.capacity_tokens,
                reserved_bytes=self.pool.reserved_bytes,
                used_blocks=self.pool.used_blocks,
            )
        )
        out = r.get_tensor(graph.LOGITS).data
        return np.array(out.reshape(-1, out.shape[-1]), copy=True)

    def _choose(self, sequence: _Sequence, logits: np.ndarray) -> Finish | None:
        """The sequence's next token from its logits row; why it ends, if it does."""
        token = sequence.chooser(logits)
        sequence.generated.append(token)
        config = sequence.request.config
        asked = bool(sequence.on_token(token)) if sequence.on_token is not None else False
        if token in config.stop_ids:
            return Finish.EOS
        if asked:
            return Finish.STOPPED
        if len(sequence.generated) >= config.max_new_tokens:
            return Finish.MAX_NEW_TOKENS
        return None

    def _leave(self, sequence: _Sequence) -> None:
        self._live.remove(sequence)
        self.pool.give_back(sequence.blocks)
        sequence.blocks = []
