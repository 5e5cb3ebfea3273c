"""The paged path (``load_mode="paged"``, CPU): one PagedAttention graph compiled from the
IR serves the prompt, in chunks, and every decode step. Attention reads only the live
blocks, so a step costs what its live length costs, not its rung's capacity; the KV is
``runtime/blockkv.py``'s block arrays. ``open`` starts reading and compiling the graph on
a thread; with two cores or more it compiles as two halves side by side, run as one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovspec.compile.devices.facts import default_precision
from ovspec.compile.halves import CompiledGraph, HalvedCompiledModel, compile_halves
from ovspec.compile.modes import LoadMode
from ovspec.errors import CompileError, LadderError, openvino_message
from ovspec.ir import paged as graph
from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder
from ovspec.runtime.blockkv import BLOCK_TOKENS, BlockKV, cache_layouts
from ovspec.runtime.loader import EventKind, LoaderEvent, Policy
from ovspec.runtime.session import BoundaryRecord, StepRecord
from ovspec.runtime.tokenizer import Tokenizer
from ovspec.store.local import Store

PAGED_LABEL = "paged"  # the graph's name in loader events


def computes_in_f32(device: str, properties: Mapping[str, str]) -> bool:
    """Whether ``device`` computes in f32 under ``properties``: only then do two halves
    give the whole graph's values (a lower precision may keep the tensor a cut hands off
    in it, where a half's output is f32)."""
    hint = properties.get("INFERENCE_PRECISION_HINT")
    if hint is None and properties.get("EXECUTION_MODE_HINT", "").upper() == "ACCURACY":
        return True
    if hint is None:
        hint = default_precision(ov.Core(), device)
    return hint.lower() in ("f32", "float32")


class PagedLoader:
    """The paged graph of one model, compiled once (ahead, or on first use); what ``decode`` asks
    of a loader (``ladder``, ``events``, ``origin_s``...), without rungs to load."""

    load_mode = LoadMode.PAGED
    policy = Policy.ON_DEMAND  # one graph: nothing to load ahead
    kv_layout = None

    def __init__(
        self,
        xml_path: Path,
        ladder: Ladder,
        device: str,
        properties: dict[str, str],
        prefill_chunk_tokens: int,
        origin_s: float | None = None,
        on_close: Sequence[Callable[[], None]] = (),
        model_dir: ModelDir | None = None,
        store: Store | None = None,
        halve_graph: bool = False,
    ) -> None:
        self.ladder = ladder
        # Compile the single-sequence graph as two halves side by side (>= 2 cores), where
        # the device computes in f32 (``computes_in_f32``).
        self.halve_graph = halve_graph
        # What a saved session's key reads: the model's files and the store it lives in.
        self.model_dir = model_dir  # None: the folder holding xml_path, when asked
        self.store = store
        self._tokenizer: Tokenizer | None = None
        self.device = device
        self.properties = dict(properties)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._xml_path = xml_path
        self._opened_s = time.perf_counter() if origin_s is None else origin_s
        self._on_close = list(on_close)
        self._events: list[LoaderEvent] = []
        self._lock = threading.Lock()
        self._compiled: CompiledGraph | None = None
        self._batched: ov.CompiledModel | None = None  # continuous batching's graph
        self._paged: graph.PagedModel | None = None  # until compiled
        self._vocab_tokens: int | None = None
        self._vocab_read = False  # _vocab_tokens holds the IR's (None: not static)
        self._closed = False
        self._ahead: threading.Thread | None = None  # reading/compiling the graph early
        self._ahead_go = threading.Event()  # the ahead thread may compile (or must stop)
        self._ahead_read = threading.Event()  # the ahead thread has read the IR (or failed)
        self._ahead_error: BaseException | None = None
        self._ahead_skip = False  # the graph it would compile is no longer wanted

    @property
    def origin_s(self) -> float:
        return self._opened_s

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (text in and out), made on first use."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.model_dir or ModelDir.open(self._xml_path.parent))
        return self._tokenizer

    @property
    def events(self) -> list[LoaderEvent]:
        with self._lock:
            return list(self._events)

    def read_ahead(self) -> None:
        """Read and transform the IR on a thread from now on, and compile it once
        ``compile_ahead`` is called: the caller's own work (checking the device, loading
        the tokenizer, templating the prompt) overlaps them. ``start`` and
        ``vocab_tokens`` wait for the thread; its error is raised there."""
        with self._lock:
            if self._ahead is not None or self._compiled is not None or self._closed:
                return
            self._ahead = threading.Thread(
                target=self._prepare, name="ovspec-paged-ahead", daemon=True
            )
            self._ahead.start()

    def compile_ahead(self) -> None:
        """Let the thread ``read_ahead`` started compile the graph it read."""
        self._ahead_go.set()

    def _prepare(self) -> None:
        try:
            paged = graph.paged_model(self._xml_path)
            with self._lock:
                self._paged, self._vocab_tokens = paged, paged.vocab_tokens
                self._vocab_read = True
            self._ahead_read.set()
            self._ahead_go.wait()
            if self._closed or self._ahead_skip:
                return
            compiled = self._compile(paged, "paged attention, from the IR", self.halve_graph)
            with self._lock:
                if not (self._closed or self._ahead_skip):
                    self._compiled, self._paged = compiled, None
        except BaseException as exc:  # raised by the thread that waits for it
            self._ahead_error = exc
        finally:
            self._ahead_read.set()

    def _join_ahead(self, compile_too: bool = True) -> None:
        """Wait for the ahead thread (only its read unless ``compile_too``); raise its
        error once (a later ``start`` then tries again in the foreground)."""
        thread = self._ahead
        if thread is None:
            return
        if compile_too:
            self._ahead_go.set()
            thread.join()
            self._ahead = None
        else:
            self._ahead_read.wait()
        error, self._ahead_error = self._ahead_error, None
        if error is not None:
            self._ahead_go.set()
            thread.join()
            self._ahead = None
            raise error

    @property
    def vocab_tokens(self) -> int | None:
        """The vocabulary, from the transformed IR (a request is checked against it
        before anything compiles)."""
        self._join_ahead(compile_too=False)
        with self._lock:
            if not self._vocab_read:
                self._paged = graph.paged_model(self._xml_path)
                self._vocab_tokens, self._vocab_read = self._paged.vocab_tokens, True
            return self._vocab_tokens

    def start(self, first_capacity_tokens: int | None = None) -> None:
        """Compile the paged graph if it is not yet (in the foreground: the prompt waits
        for it); any rung's first token runs on it."""
        self._join_ahead()
        with self._lock:
            if self._closed:
                raise LadderError("the loader is closed")
            if self._compiled is not None:
                return
            paged = self._paged or graph.paged_model(self._xml_path)
            self._compiled = self._compile(paged, "paged attention, from the IR", self.halve_graph)
            self._paged = None  # the compiled graph holds what it needs

    def batched_graph(self) -> ov.CompiledModel:
        """The paged graph with one logits row per sequence of a call (its
        ``logits_indices`` input), compiled on first use: what continuous batching runs.
        The single-sequence graph an ahead thread would compile is dropped unused."""
        self._ahead_skip = self._compiled is None
        self._join_ahead()
        with self._lock:
            if self._closed:
                raise LadderError("the loader is closed")
            if self._batched is None:
                paged = graph.paged_model(self._xml_path, per_sequence_logits=True)
                batched = self._compile(paged, "paged attention, per-sequence logits")
                assert isinstance(batched, ov.CompiledModel)  # never halved
                self._batched = batched
            return self._batched

    def _compile(self, paged: graph.PagedModel, note: str, halve: bool = False) -> CompiledGraph:
        """Compile ``paged``; with ``halve``, as two halves side by side where it splits
        (a CPU compile keeps one core busy: it takes them all about half the time)."""
        began = time.perf_counter()
        self._record(EventKind.LOAD_START, began, 0.0)
        self._paged = None  # taken apart by a split: a compile that fails reads it again
        try:
            exact = halve and computes_in_f32(self.device, self.properties)
            halves = graph.paged_halves(paged) if exact else None
            if halves is None:
                compiled: CompiledGraph = ov.Core().compile_model(
                    paged.model, self.device, self.properties
                )
            else:
                compiled = compile_halves(ov.Core(), halves, self.device, self.properties)
                note += ", in two halves compiled side by side"
        except RuntimeError as exc:
            raise CompileError(
                f"{self.device} could not compile the paged graph: {openvino_message(exc)}"
            ) from exc
        done = time.perf_counter()
        self._record(EventKind.COMPILED, done, done - began, note)
        self._record(EventKind.LOADED, done, 0.0)
        self._vocab_tokens, self._vocab_read = paged.vocab_tokens, True
        return compiled

    def sequence(
        self, first_capacity_tokens: int, reachable_tokens: int | None = None
    ) -> PagedSequence:
        """A sequence starting on ``first_capacity_tokens``; ``reachable_tokens`` (the KV
        positions its request can fill) caps what each rung reserves."""
        self.start()
        assert self._compiled is not None
        return PagedSequence(
            self._compiled,
            self.ladder,
            first_capacity_tokens,
            self.prefill_chunk_tokens,
            self._opened_s,
            reachable_tokens,
        )

    def compiled_properties(self, names: Sequence[str]) -> dict[str, object]:
        """The compiled graph's values of ``names`` (those it reports), compiling it first."""
        self.start()
        assert self._compiled is not None
        # Halves compile with the same properties: the front's values are the graph's.
        one = (
            self._compiled.front
            if isinstance(self._compiled, HalvedCompiledModel)
            else self._compiled
        )
        assert isinstance(one, ov.CompiledModel)  # a paged graph is never cut
        supported = set(one.get_property("SUPPORTED_PROPERTIES"))
        return {name: one.get_property(name) for name in names if name in supported}

    def builds_in_flight(self) -> tuple[str, ...]:
        """Nothing: the one graph is compiled in the foreground."""
        return ()

    def _record(self, kind: EventKind, at: float, seconds: float, note: str = "") -> None:
        self._events.append(
            LoaderEvent(kind, PAGED_LABEL, at - self._opened_s, True, seconds, note)
        )

    def close(self, wait_for_builds: bool = True) -> None:
        """Drop the graph (``wait_for_builds``: as ``Loader.close``; nothing builds here)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._ahead_go.set()  # a compile under way cannot be stopped: it is waited for
        if self._ahead is not None:
            self._ahead.join()
        with self._lock:
            self._compiled = self._batched = None
        for hook in reversed(self._on_close):
            hook()

    def __enter__(self) -> PagedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BoundInputs:
    """A request's small per-call inputs, each bound once per shape: a call whose input has
    the shape of the last one's writes its values into the bound array, which the plugin
    reads at ``infer``; so a decode step rebinds only what changed shape (the block list,
    once a block). Setting seven tensors per step was a measurable part of a short step."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self._bound: dict[str, np.ndarray] = {}

    def put(self, name: str, values: np.ndarray) -> None:
        held = self._bound.get(name)
        if held is not None and held.shape == values.shape and held.dtype == values.dtype:
            held[...] = values
            return
        owned = np.array(values, copy=True, order="C")  # the tensor shares this memory
        self._request.set_tensor(name, ov.Tensor(owned, shared_memory=True))
        self._bound[name] = owned


class PagedSequence:
    """One sequence on the paged graph: its request, its block KV, what each call cost."""

    def __init__(
        self,
        compiled: CompiledGraph,
        ladder: Ladder,
        capacity_tokens: int,
        chunk_tokens: int,
        origin_s: float,
        reachable_tokens: int | None = None,
    ) -> None:
        self.ladder = ladder
        self.chunk_tokens = chunk_tokens
        self.reachable_tokens = reachable_tokens
        self.request = compiled.create_infer_request()
        self._inputs = BoundInputs(self.request)
        self.kv = BlockKV(
            cache_layouts(compiled),
            capacity_tokens,
            self._reserved_tokens(capacity_tokens, 0),
            ceiling_tokens=self._reserved_tokens(ladder.top_tokens, 0),
        )
        self._bind_kv()
        self._origin_s = origin_s
        self.steps: list[StepRecord] = []
        self.boundaries: list[BoundaryRecord] = []

    def _bind_kv(self) -> None:
        for name, tensor in self.kv.tensors().items():
            self.request.set_tensor(name, tensor)

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """The prompt in chunks; the last token's logits."""
        logits = np.empty(0, np.float32)
        for start in range(0, len(prompt_ids), self.chunk_tokens):
            logits = self._run(prompt_ids[start : start + self.chunk_tokens], prefill=True)
        return logits

    def step(self, token_id: int) -> np.ndarray:
        return self._run([token_id], prefill=False)

    def _run(self, token_ids: Sequence[int], prefill: bool) -> np.ndarray:
        live, n = self.kv.live_tokens, len(token_ids)
        total = live + n
        if total > self.kv.capacity_tokens:
            rung = self.ladder.rung_for(total)
            self._grow(rung, self._reserved_tokens(rung, total))
        elif total > self.kv.reserved_tokens:  # past the reachable length it was given
            raise LadderError(
                f"{total} KV positions exceed the {self.kv.reserved_tokens} this sequence "
                "reserved for its request's reachable length"
            )
        self.feed(token_ids)
        r = self.request
        began = time.perf_counter()
        r.infer()  # the PagedAttention op writes the new tokens' K/V into the blocks
        self.steps.append(
            StepRecord(
                live,
                self.kv.capacity_tokens,
                n,
                prefill,
                began - self._origin_s,
                time.perf_counter() - began,
            )
        )
        self.kv.live_tokens = total
        out = r.get_tensor(graph.LOGITS).data
        return np.array(out.reshape(-1, out.shape[-1])[-1], copy=True)

    def feed(self, token_ids: Sequence[int]) -> None:
        """Bind the inputs of a call that appends ``token_ids`` after the live tokens
        (the KV must already hold room for them)."""
        live, n = self.kv.live_tokens, len(token_ids)
        total = live + n
        blocks = math.ceil(total / BLOCK_TOKENS)
        put = self._inputs.put
        put(graph.INPUT_IDS, np.asarray(token_ids, np.int64))
        put(graph.POSITION_IDS, np.arange(live, total, dtype=np.int64))
        put(graph.PAST_LENS, np.array([live], np.int32))
        put(graph.SUBSEQUENCE_BEGINS, np.array([0, n], np.int32))
        put(graph.BLOCK_INDICES, np.arange(blocks, dtype=np.int32))
        put(graph.BLOCK_INDICES_BEGINS, np.array([0, blocks], np.int32))
        put(graph.MAX_CONTEXT_LEN, np.array(total, np.int32))

    def grow_to(self, capacity_tokens: int) -> None:
        """Move the KV to ``capacity_tokens`` now (a boundary), live blocks kept."""
        self._grow(capacity_tokens, self._reserved_tokens(capacity_tokens, self.kv.live_tokens))

    def _reserved_tokens(self, rung_tokens: int, needed_tokens: int) -> int:
        """What a rung reserves: its capacity, or the whole blocks that hold the request's
        reachable length when that is less (never fewer than ``needed_tokens``)."""
        if self.reachable_tokens is None:
            return rung_tokens
        reachable = max(self.reachable_tokens, needed_tokens, 1)
        return min(rung_tokens, math.ceil(reachable / BLOCK_TOKENS) * BLOCK_TOKENS)

    def _grow(self, capacity_tokens: int, reserved_tokens: int) -> None:
        began = time.perf_counter()
        migration = self.kv.grow(capacity_tokens, reserved_tokens)
        bound = time.perf_counter()
        self._bind_kv()
        self.boundaries.append(
            BoundaryRecord(
                at_live_tokens=self.kv.live_tokens,
                began_s=began - self._origin_s,
                migration=migration,
                program_wait_s=0.0,
                bind_s=time.perf_counter() - bound,
            )
        )

    def close(self) -> None:
        self.kv.close()
