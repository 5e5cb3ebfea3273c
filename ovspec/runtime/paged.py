"""The paged path (``load_mode="paged"``, CPU): one PagedAttention graph compiled from the
IR serves the prompt, in chunks, and every decode step. Attention reads only the live
blocks, so a step costs what its live length costs, not its rung's capacity. The KV is
block arrays this module owns, reserved one rung at a time and grown at a boundary; a
rung the request cannot fill is reserved only up to the request's reachable length.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import openvino as ov

from ovspec.compile.modes import LoadMode
from ovspec.errors import CompileError, LadderError, openvino_message
from ovspec.ir import paged as graph
from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import Migration
from ovspec.runtime.loader import EventKind, LoaderEvent, Policy
from ovspec.runtime.session import BoundaryRecord, StepRecord
from ovspec.runtime.tokenizer import Tokenizer
from ovspec.store.local import Store

# The CPU plugin's PagedAttention block: tokens per block of every cache array.
BLOCK_TOKENS = 32
PAGED_LABEL = "paged"  # the graph's name in loader events


def cache_layouts(compiled: ov.CompiledModel) -> dict[str, tuple[ov.Shape, ov.Type]]:
    """Each cache input's block shape (without the block axis) and element type."""
    layouts = {}
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith((graph.KEY_CACHE_PREFIX, graph.VALUE_CACHE_PREFIX)):
            dims = ov.Shape([d.get_length() for d in list(port.get_partial_shape())[1:]])
            layouts[name] = (dims, port.get_element_type())
    return layouts


class BlockKV:
    """One sequence's KV as ``[blocks, ...]`` byte arrays, one per cache input, typed as
    the compiled graph wants (bf16, u8 or u4 included), holding its rung's capacity.
    ``reserved_tokens`` (at most the capacity) holds fewer blocks where the sequence
    cannot fill its rung. With ``ceiling_tokens`` (the most it may ever reserve) and a
    kernel that maps pages, each array is a view of an address range reserved up to the
    ceiling whose pages (huge where the kernel gives them) commit on first write: growing
    widens the views, no byte copied; otherwise growing copies the live blocks once."""

    def __init__(
        self,
        layouts: dict[str, tuple[ov.Shape, ov.Type]],
        capacity_tokens: int,
        reserved_tokens: int | None = None,
        ceiling_tokens: int | None = None,
    ) -> None:
        self._layouts = layouts
        self.capacity_tokens = capacity_tokens
        self.reserved_tokens = min(reserved_tokens or capacity_tokens, capacity_tokens)
        self.live_tokens = 0
        self.measure_physical = False
        self._regions: dict[str, vmem.Region] = {}
        if ceiling_tokens is not None and vmem.unsupported_reason() is None:
            blocks = math.ceil(max(ceiling_tokens, self.reserved_tokens) / BLOCK_TOKENS)
            # Huge pages: a decode step reads every live block of every layer.
            self._regions = {
                name: vmem.Region(blocks * self._block_bytes(name), huge_pages=True)
                for name in layouts
            }
        self._arrays = self._allocate(self.reserved_tokens)

    def _block_bytes(self, name: str) -> int:
        dims, kind = self._layouts[name]
        return int(math.prod(dims) * kind.bitwidth // 8)

    def _in_regions(self, capacity_tokens: int) -> bool:
        blocks = math.ceil(capacity_tokens / BLOCK_TOKENS)
        return bool(self._regions) and all(
            blocks * self._block_bytes(n) <= r.size_bytes for n, r in self._regions.items()
        )

    def _allocate(self, capacity_tokens: int) -> dict[str, np.ndarray]:
        blocks = math.ceil(capacity_tokens / BLOCK_TOKENS)
        if self._in_regions(capacity_tokens):  # views of the reserved ranges
            return {
                name: region.array(0, (blocks, self._block_bytes(name)), np.dtype(np.uint8))
                for name, region in self._regions.items()
            }
        return {
            name: np.zeros((blocks, self._block_bytes(name)), np.uint8) for name in self._layouts
        }

    def tensors(self) -> dict[str, ov.Tensor]:
        return {
            name: ov.Tensor(array, ov.Shape([len(array), *self._layouts[name][0]]), kind)
            for name, array in self._arrays.items()
            for kind in (self._layouts[name][1],)
        }

    def grow(self, capacity_tokens: int, reserved_tokens: int | None = None) -> Migration:
        """Move to ``capacity_tokens`` (``reserved_tokens`` of it): wider views of the
        reserved ranges, or new arrays, the live blocks copied, the old freed."""
        if capacity_tokens <= self.capacity_tokens:
            raise LadderError(f"cannot grow KV from {self.capacity_tokens} to {capacity_tokens}")
        began = time.perf_counter()
        old, old_bytes = self._arrays, self.reserved_bytes
        reserved = min(reserved_tokens or capacity_tokens, capacity_tokens)
        in_place = self._in_regions(reserved)
        new = self._allocate(reserved)
        live_blocks = math.ceil(self.live_tokens / BLOCK_TOKENS)
        copied = 0
        for name, array in old.items() if not in_place else ():
            new[name][:live_blocks] = array[:live_blocks]
            copied += array[:live_blocks].nbytes
        copy_s = time.perf_counter() - began
        allocated = sum(a.nbytes for a in new.values())
        self._arrays = new
        del old
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=self.live_tokens,
            copied_bytes=copied,
            allocated_bytes=allocated,
            seconds=time.perf_counter() - began,
            peak_reserved_bytes=allocated if in_place else old_bytes + allocated,
            copy_seconds=copy_s,
        )
        self.capacity_tokens, self.reserved_tokens = capacity_tokens, reserved
        return migration

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def arrays(self) -> dict[str, np.ndarray]:
        """Each cache input's ``[blocks, bytes]`` array (writes land in the KV); valid
        until the next ``grow``."""
        return dict(self._arrays)

    def spans(self) -> list[tuple[int, int]]:
        return [(a.ctypes.data, a.nbytes) for a in self._arrays.values()]

    def physical_bytes(self) -> int | None:
        return vmem.resident_bytes(self.spans())

    def close(self) -> None:
        self._arrays = {}
        self._regions = {}  # each unmapped once no view or bound tensor holds it


class PagedLoader:
    """The paged graph of one model, compiled once on first use; what ``decode`` asks
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
    ) -> None:
        self.ladder = ladder
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
        self._compiled: ov.CompiledModel | None = None
        self._batched: ov.CompiledModel | None = None  # continuous batching's graph
        self._paged: graph.PagedModel | None = None  # until compiled
        self._vocab_tokens: int | None = None
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
            self._ahead_read.set()
            self._ahead_go.wait()
            if self._closed or self._ahead_skip:
                return
            compiled = self._compile(paged, "paged attention, from the IR")
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
            if self._compiled is None and self._batched is None and self._paged is None:
                self._paged = graph.paged_model(self._xml_path)
                self._vocab_tokens = self._paged.vocab_tokens
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
            self._compiled = self._compile(paged, "paged attention, from the IR")
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
                self._batched = self._compile(paged, "paged attention, per-sequence logits")
            return self._batched

    def _compile(self, paged: graph.PagedModel, note: str) -> ov.CompiledModel:
        began = time.perf_counter()
        self._record(EventKind.LOAD_START, began, 0.0)
        try:
            compiled = ov.Core().compile_model(paged.model, self.device, self.properties)
        except RuntimeError as exc:
            raise CompileError(
                f"{self.device} could not compile the paged graph: {openvino_message(exc)}"
            ) from exc
        done = time.perf_counter()
        self._record(EventKind.COMPILED, done, done - began, note)
        self._record(EventKind.LOADED, done, 0.0)
        self._vocab_tokens = paged.vocab_tokens
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
        supported = set(self._compiled.get_property("SUPPORTED_PROPERTIES"))
        return {name: self._compiled.get_property(name) for name in names if name in supported}

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


class PagedSequence:
    """One sequence on the paged graph: its request, its block KV, what each call cost."""

    def __init__(
        self,
        compiled: ov.CompiledModel,
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
        r = self.request
        r.set_tensor(graph.INPUT_IDS, ov.Tensor(np.asarray(token_ids, np.int64)))
        r.set_tensor(graph.POSITION_IDS, ov.Tensor(np.arange(live, total, dtype=np.int64)))
        r.set_tensor(graph.PAST_LENS, ov.Tensor(np.array([live], np.int32)))
        r.set_tensor(graph.SUBSEQUENCE_BEGINS, ov.Tensor(np.array([0, n], np.int32)))
        r.set_tensor(graph.BLOCK_INDICES, ov.Tensor(np.arange(blocks, dtype=np.int32)))
        r.set_tensor(graph.BLOCK_INDICES_BEGINS, ov.Tensor(np.array([0, blocks], np.int32)))
        r.set_tensor(graph.MAX_CONTEXT_LEN, ov.Tensor(np.array(total, np.int32)))

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
