"""The serving engine: one thread that owns a ``ContinuousBatcher`` and steps it, a
bounded inbox the HTTP handlers submit to, and tickets that carry each sequence's
tokens back to its handler's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ovspec.errors import OvspecError
from ovspec.runtime.batching import BatchRequest, ContinuousBatcher, Finish, TokenEvent
from ovspec.runtime.paged import PagedLoader

# The window the tokens/s gauge averages over.
RATE_WINDOW_S = 10.0


class OverloadedError(OvspecError):
    """The queue is full: the client should retry later (HTTP 429)."""

    exit_code = 2


class ShuttingDownError(OvspecError):
    """The server is stopping and takes no new request (HTTP 503)."""

    exit_code = 2


class EngineFailedError(OvspecError):
    """An infer failed; the sequences it carried end with this (HTTP 500)."""


@dataclass(frozen=True)
class EngineStats:
    """What the batch holds now, and what it has done (the metrics read this)."""

    queued: int
    running: int
    capacity_tokens: int  # the KV pool's reservation: the rung in use
    reserved_bytes: int
    generated_tokens: int  # since start
    tokens_per_s: float  # over the last RATE_WINDOW_S
    steps: int
    growths: int  # KV pool boundaries crossed
    growth_s: float  # seconds spent growing the pool (boundary waits)
    cancelled: int  # sequences ended by a cancel (a client gone, a shutdown)


class Ticket:
    """One request's way back: the engine thread posts events, the handler iterates
    them on its own event loop until the sequence finishes."""

    def __init__(self, request: BatchRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.sequence_id: int | None = None
        self.cancelled = False
        self.finish: Finish | None = None
        self.error: OvspecError | None = None
        self._loop = loop
        self._events: asyncio.Queue[TokenEvent | OvspecError] = asyncio.Queue()

    def post(self, event: TokenEvent | OvspecError) -> None:
        """From the engine thread: hand ``event`` to the handler's loop."""
        # A closed loop: the server is gone, nobody reads this ticket.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def tokens(self) -> AsyncIterator[int]:
        """Each generated token id; ends when the sequence does (``finish`` set), or
        raises the engine's error."""
        while self.finish is None:
            event = await self._events.get()
            if isinstance(event, OvspecError):
                self.error = event
                raise event
            if event.token_id is not None:
                yield event.token_id
            if event.finish is not None:
                self.finish = event.finish


class Engine:
    """Steps the batcher on its own thread while sequences are waiting or running.

    ``submit`` refuses a request the model cannot take (``BadRequestError``), one over
    ``max_queue`` waiting (``OverloadedError``) and any once ``close`` began
    (``ShuttingDownError``). ``close`` cancels what is left and closes the loader.
    """

    def __init__(self, loader: PagedLoader, max_sequences: int, max_queue: int) -> None:
        self.loader = loader
        self.max_queue = max_queue
        self.batcher = ContinuousBatcher(loader, max_sequences=max_sequences)
        self._cond = threading.Condition()
        self._inbox: list[Ticket] = []
        self._cancels: list[Ticket] = []
        self._tickets: dict[int, Ticket] = {}
        self._stopping = False
        self._generated = 0
        self._cancelled = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._thread = threading.Thread(target=self._run, name="ovspec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: BatchRequest, loop: asyncio.AbstractEventLoop) -> Ticket:
        self.batcher.check(request)
        ticket = Ticket(request, loop)
        with self._cond:
            if self._stopping:
                raise ShuttingDownError("the server is shutting down; retry on another")
            if len(self._inbox) + self.batcher.waiting >= self.max_queue:
                raise OverloadedError(f"{self.max_queue} requests are already waiting; retry later")
            self._inbox.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """End ``ticket``'s sequence (a client went away); a finished one is left alone."""
        with self._cond:
            if ticket.finish is None and not ticket.cancelled:
                ticket.cancelled = True
                self._cancels.append(ticket)
                self._cond.notify()

    def stats(self) -> EngineStats:
        now = time.monotonic()
        with self._cond:
            queued = len(self._inbox) + self.batcher.waiting
            recent = sum(n for at, n in self._recent if at >= now - RATE_WINDOW_S)
        growths = self.batcher.growths
        return EngineStats(
            queued=queued,
            running=self.batcher.running,
            capacity_tokens=self.batcher.pool.capacity_tokens,
            reserved_bytes=self.batcher.pool.reserved_bytes,
            generated_tokens=self._generated,
            tokens_per_s=recent / RATE_WINDOW_S,
            steps=len(self.batcher.steps),
            growths=len(growths),
            growth_s=sum(g.migration.seconds for g in growths),
            cancelled=self._cancelled,
        )

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        for ticket in [*self._inbox, *self._tickets.values()]:
            ticket.post(TokenEvent(-1, None, Finish.CANCELLED))
        self.batcher.close()
        self.loader.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._inbox or self._cancels or self._stopping) and self.batcher.idle:
                    self._cond.wait()
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
            for ticket in inbox:
                if ticket.cancelled:
                    ticket.post(TokenEvent(-1, None, Finish.CANCELLED))
                    continue
                ticket.sequence_id = self.batcher.submit(ticket.request)
                self._tickets[ticket.sequence_id] = ticket
            for ticket in cancels:
                if ticket.sequence_id is not None:
                    self.batcher.cancel(ticket.sequence_id)
            self._step()

    def _step(self) -> None:
        try:
            events = self.batcher.step()
        except OvspecError as exc:
            self._fail(exc)
            return
        except RuntimeError as exc:  # OpenVINO's: one failed call ends its sequences only
            self._fail(EngineFailedError(f"the batch's infer failed: {exc}"))
            return
        tokens = sum(e.token_id is not None for e in events)
        self._generated += tokens
        now = time.monotonic()
        with self._cond:
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
        for event in events:
            ticket = self._tickets.get(event.sequence_id)
            if ticket is None:
                continue
            ticket.post(event)
            if event.finish is not None:
                del self._tickets[event.sequence_id]
                self._cancelled += event.finish is Finish.CANCELLED

    def _fail(self, error: OvspecError) -> None:
        for sequence_id, ticket in list(self._tickets.items()):
            self.batcher.cancel(sequence_id)
            ticket.post(error)
        self._tickets.clear()
        self.batcher.step()  # drops the cancelled: their blocks go back
