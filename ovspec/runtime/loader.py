"""The lazy loader a decode runtime calls one step ahead.

``get(spec)`` returns a compiled specialization from memory, the store (a remote fetch
preferred to a compile) or a compile, blocking only when it must; ``prefetch(spec)``
queues the same work on a background worker. A policy decides what is compiled when:
``eager`` (every rung up front), ``one_ahead`` (the successor in the background after
each switch, earlier when a deadline plan says so), ``on_demand`` (the stall baseline);
``auto``: ``autorun.AutoLoader``. None builds past the request's reach; all is an event.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ovspec.compile.compiler import Compiler
from ovspec.compile.halves import CompiledGraph, HalvedCompiledModel
from ovspec.compile.modes import LoadMode
from ovspec.compile.programs import Program
from ovspec.compile.split import SplitPins
from ovspec.errors import CompileError, OvspecError
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import Phase, Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.schedule import WindowPlan, reachable_top_tokens, successors_to_start
from ovspec.runtime.tokenizer import Tokenizer
from ovspec.runtime.worker import Worker, builds_left_running, warm_up
from ovspec.store.local import Store

__all__ = ["EventKind", "Loader", "LoaderEvent", "Policy", "WindowPlan", "builds_left_running"]


class Policy(Enum):
    EAGER = "eager"
    ONE_AHEAD = "one_ahead"
    ON_DEMAND = "on_demand"
    AUTO = "auto"  # per request, from known costs (runtime/autorun.py)


class EventKind(Enum):
    LOAD_START = "load_start"  # build (store lookup or compile) + import begins
    COMPILED = "compiled"  # the blob was compiled (a store miss)
    STORE_HIT = "store_hit"  # the blob came from the store
    FETCHED = "fetched"  # the blob came from the remote tier (no compile here)
    LOADED = "loaded"  # imported and ready
    FAILED = "failed"
    WAIT = "wait"  # get() blocked on a background load
    EARLY_START = "early_start"  # the plan queued a rung before its one-ahead turn
    RELEASED = "released"  # a graph the sequence has passed was dropped
    PLANNED = "planned"  # auto's schedule for a request (seconds: its predicted last token)
    REPLANNED = "replanned"  # auto moved builds: measured times drifted from the plan


@dataclass(frozen=True)
class LoaderEvent:
    kind: EventKind
    spec: str  # specialization label
    at_s: float  # seconds since the loader's origin (its opening, unless given)
    foreground: bool
    seconds: float = 0.0  # the duration this event closes (compile, import, wait)
    note: str = ""
    # COMPILED under the device/host split: the host's whole build (compile, export,
    # the validating import, publish), which is what the next rung waits for.
    build_s: float = 0.0


class Loader:
    """Compiled specializations on demand, ahead of demand, or all up front."""

    def __init__(
        self,
        compiler: Compiler,
        ladder: Ladder,
        policy: Policy,
        prefill_chunk_tokens: int | None = None,
        window_plan: WindowPlan | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_close: Sequence[Callable[[], None]] = (),
        origin_s: float | None = None,
        warm_up: bool = True,
        kv_layout: KVLayout | None = None,
        worker_cores: tuple[int, ...] | None = None,
        pins: SplitPins | None = None,
        on_steady: Callable[[], None] | None = None,
        halve_prompt_graph: bool = False,
        release_passed_rungs: bool | None = None,
        warm_first_rung: bool = True,
    ) -> None:
        self._compiler = compiler
        self.kv_layout = kv_layout  # the sequences' default (None: remap where it works)
        self.ladder = ladder
        self.policy = policy
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.window_plan = window_plan
        self.warm_up = warm_up
        self._warmed = False
        self.warm_first_rung = warm_first_rung  # False: a first rung's first step warms it
        self._unwarmed: Specialization | None = None
        self._clock = clock
        self._opened_s = clock() if origin_s is None else origin_s
        self._lock = threading.Lock()
        self._programs: dict[Specialization, Program] = {}
        self._pending: dict[Specialization, Future[Program]] = {}
        self._events: list[LoaderEvent] = []
        # The split: the worker on the host cores; once the foreground is over (it may use
        # every core) ``pins`` moves threads to their cores, again around each load.
        self.worker_cores = worker_cores
        self._pins = pins
        self._worker = Worker(worker_cores)
        self._closed = False
        self._on_close = list(on_close)
        # Called once: at the first decode get (after the prompt), as an eager start begins
        # or an import-mode start ends (the weight-page trimmer, off a latency-bound start).
        self._on_steady = on_steady
        # A lazy start compiles the graph its prompt waits for as two halves on two cores
        # (``Compiler.load(halves=True)``) when nothing else loads meanwhile.
        self.halve_prompt_graph = halve_prompt_graph
        # Whether a sequence drops the rungs it has left unless told (None: the policy's).
        self.release_passed_rungs = release_passed_rungs
        # KV positions the current request can fill (prompt + fed-back tokens); no rung
        # beyond the one holding them is started. None: any rung may be reached.
        self.reachable_tokens: int | None = None
        self._tokenizer: Tokenizer | None = None

    # -- public API ---------------------------------------------------------------

    def start(self, first_capacity_tokens: int, reachable_tokens: int | None = None) -> None:
        """Foreground work before the prompt can run, as the policy prescribes.

        ``reachable_tokens``: the KV positions the request can fill (prompt and fed-back
        tokens); no policy builds a rung above the one holding them. None: any rung.

        One-ahead and on-demand return as soon as the graph the prompt needs is ready
        (the prefill graph, or the decode graph without one); the first rung's decode
        graph keeps loading on the worker while the prompt runs, and the first decode
        ``get`` waits for it if it must (a recorded wait). Successors are queued by
        that ``get``, after the prompt: the prefill graph is released by then, so it,
        the first rung and a successor never hold their weights at the same time.

        Eager loads every rung before returning, two at a time (every other one on
        the worker: a CPU compile keeps about one core busy). An import-mode start ends
        steady: imports read WEIGHTS_PATH, so the IR mapping's pages go before the prompt.
        """
        self.reachable_tokens = reachable_tokens
        try:
            self._start(first_capacity_tokens)
            if self.load_mode is LoadMode.IMPORT:
                self._steady()
        finally:
            self._begin_split()

    def _steady(self) -> None:
        hook, self._on_steady = self._on_steady, None
        if hook is not None:
            hook()

    def _start(self, first_capacity_tokens: int) -> None:
        decode = Specialization.decode(first_capacity_tokens)
        self._unwarmed = None if self.warm_first_rung else decode
        prefill = self._prefill(first_capacity_tokens) if self.prefill_chunk_tokens else None
        if prefill is not None:
            self.share_prompt_rung(first_capacity_tokens)
        shared = prefill is not None and self.graph_spec(decode) == self.graph_spec(prefill)
        if self.policy is Policy.EAGER:
            self._steady()
            top = self.reachable_top_tokens
            rungs = [c for c in self.ladder if first_capacity_tokens <= c <= top]
            later = [Specialization.decode(c) for c in rungs[1:]]
            # A decode served by the prompt's graph is taken last, once that graph is in:
            # no worker slot waits on it.
            if prefill is not None and shared:
                specs = [prefill, *later, decode]
            else:
                specs = [*([prefill] if prefill else []), decode, *later]
            for spec in specs[1::2]:
                self._submit(spec, foreground=True)
            for spec in specs:
                self._obtain(spec, record_wait=False)
            return
        halves = self.halve_prompt_graph  # not beside a load on the worker (below)
        if prefill is None:
            self._obtain(decode, record_wait=False, halves=halves)
            return
        # One graph may serve the rung's prefill and decode (COMPILE mode on CPU): the
        # worker stays idle, and the decode is taken at once (no compile, no warm-up),
        # keeping the graph alive when the session releases the prefill after the prompt.
        if not shared:
            self._compiler.build_ahead(prefill)  # the prompt's graph first
            self._submit(decode, foreground=True)
            self._obtain(prefill, record_wait=False)
            return
        self._obtain(prefill, record_wait=False, halves=halves)
        self._obtain(decode, record_wait=False)

    def share_prompt_rung(self, capacity_tokens: int) -> None:
        """The rung a prompt runs on decodes on its prefill graph (COMPILE mode), unless
        an earlier sequence left a decode graph for it: that graph is kept as it is."""
        decode = Specialization.decode(capacity_tokens)
        with self._lock:
            if decode in self._programs or decode in self._pending:
                return
        self._compiler.share_rung(capacity_tokens)

    def get(self, spec: Specialization | int) -> CompiledGraph:
        """The compiled graph of ``spec`` (a rung means its decode graph); loads it in the
        foreground if nobody has."""
        self._check_open()
        spec = _as_spec(spec)
        if spec.phase is Phase.DECODE:
            self._steady()  # before the split pins this process's other threads
        self._begin_split()
        program = self._obtain(spec, record_wait=True)
        self._after_get(spec)
        return program.compiled

    def load_now(self, spec: Specialization | int) -> None:
        """Have ``spec`` loaded when this returns (waiting for a load under way), queuing no
        successor, recording no wait: for callers that keep loads out of what they time."""
        self._obtain(_as_spec(spec), record_wait=False)

    def _obtain(self, spec: Specialization, record_wait: bool, halves: bool = False) -> Program:
        """From memory, from a load under way (waiting for it), or loaded here."""
        self._check_open()
        with self._lock:
            program = self._programs.get(spec)
            pending = self._pending.get(spec)
            owner = program is None and pending is None
            if owner:
                # Register the foreground load so concurrent get()s wait for it.
                pending = Future()
                self._pending[spec] = pending
        if program is not None:
            return program
        assert pending is not None
        if owner:
            try:
                program = self._load(spec, foreground=True, halves=halves)
            except BaseException as exc:
                pending.set_exception(exc)
                raise
            pending.set_result(program)
            return program
        began = self._clock()
        try:
            program = pending.result()
        except OvspecError:
            raise
        except Exception as exc:  # a bug or an OpenVINO crash in the worker
            raise CompileError(f"background load of {spec.label} failed: {exc}") from exc
        if record_wait:
            self._record(EventKind.WAIT, spec, foreground=True, seconds=self._clock() - began)
        return program

    def prefetch(self, spec: Specialization | int) -> None:
        """Queue ``spec`` on the background worker (no-op if loaded or queued)."""
        self._check_open()
        self._submit(_as_spec(spec), foreground=False)

    def _submit(self, spec: Specialization, foreground: bool) -> None:
        with self._lock:
            if spec in self._programs or spec in self._pending:
                return
            self._pending[spec] = self._worker.submit(self._load, spec, foreground)

    def release(self, spec: Specialization | int) -> None:
        """Drop a graph nobody needs (a rung a sequence has left: on CPU its own copy of the
        weights, on NPU what it holds beyond the weights bank); a later ``get`` imports it."""
        spec = _as_spec(spec)
        with self._lock:
            if self._programs.pop(spec, None) is not None:
                self._pending.pop(spec, None)
        self._record(EventKind.RELEASED, spec, foreground=True)

    def disable_warm_up(self) -> None:
        """Stop warming programs with dense inputs, for shared-max KV views: OpenVINO
        2026.4's CPU plugin corrupts its heap when one compiled model runs with dense
        input tensors and later with strided (ROI) ones."""
        if self._warmed:
            raise OvspecError(
                "this loader already warmed programs with dense inputs; open a new loader "
                "for shared-max KV (strided views)"
            )
        self.warm_up = False

    @property
    def reachable_top_tokens(self) -> int:  # the top rung the current request can reach
        return reachable_top_tokens(self.ladder, self.reachable_tokens)

    def builds_in_flight(self) -> tuple[str, ...]:
        """Labels of loads nobody has taken yet (running or queued): what ``close`` waits for."""
        with self._lock:
            return tuple(spec.label for spec, f in self._pending.items() if not f.done())

    @property
    def origin_s(self) -> float:
        """The ``perf_counter`` value event times are measured from."""
        return self._opened_s

    # -- what a runtime needs about the model and the device --------------------------

    def roles(self, hint: Specialization | None = None) -> ModelRoles:
        """The model's KV tensors, inputs and vocabulary (``hint``: a specialization whose
        stored blob's record may answer, so a warm start never reads the IR)."""
        return self._compiler.roles(hint)

    def graph_spec(self, spec: Specialization) -> Specialization:
        """The specialization whose graph serves ``spec`` (a rung's prefill graph may
        serve its decode too)."""
        return self._compiler.graph_spec(spec)

    @property
    def load_mode(self) -> LoadMode:
        return self._compiler.load_mode

    @property
    def device(self) -> str:
        return self._compiler.device

    @property
    def properties(self) -> dict[str, str]:  # what graphs are compiled or imported with
        return dict(self._compiler.properties)

    @property
    def model_dir(self) -> ModelDir:
        return self._compiler.model_dir

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (text in and out), made on first use."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.model_dir)
        return self._tokenizer

    @property
    def weights_path(self) -> Path:
        return self._compiler.model_dir.bin_path

    @property
    def weights_bytes(self) -> int:  # what one copy of the weights takes
        return self.weights_path.stat().st_size

    @property
    def store(self) -> Store:
        return self._compiler.store

    def program(self, spec: Specialization) -> Program | None:
        with self._lock:
            return self._programs.get(spec)

    def ready(self, spec: Specialization) -> bool:
        with self._lock:
            return spec in self._programs

    @property
    def events(self) -> list[LoaderEvent]:
        with self._lock:
            return list(self._events)

    def close(self, wait_for_builds: bool = True) -> None:
        """Stop the worker and drop compiled models; queued loads never start. A load in
        flight (a compile cannot be stopped) is waited for, or with ``wait_for_builds``
        False left to finish on the worker, which then closes what the loader owns."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            running = [f for f in self._pending.values() if not f.done()]
        self._worker.close(running, wait=wait_for_builds, then=self._release_all)

    def _release_all(self) -> None:
        with self._lock:
            self._programs.clear()
            self._pending.clear()
        for callback in self._on_close:
            callback()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    def _begin_split(self) -> None:
        if self._pins is not None:
            self._pins.begin()

    def _prefill(self, capacity_tokens: int) -> Specialization:
        chunk = self.prefill_chunk_tokens or 1
        return Specialization.prefill(capacity_tokens, min(chunk, capacity_tokens))

    def _load(self, spec: Specialization, foreground: bool, halves: bool = False) -> Program:
        with self._pins.loading() if self._pins is not None else contextlib.nullcontext():
            return self._load_here(spec, foreground, halves)

    def _load_here(self, spec: Specialization, foreground: bool, halves: bool) -> Program:
        self._record(EventKind.LOAD_START, spec, foreground)
        try:
            program = self._compiler.load(spec, halves=halves)
        except Exception as exc:
            # The failed future stays in _pending: get() at the boundary re-raises it
            # rather than compiling the same failure again in the foreground.
            self._record(EventKind.FAILED, spec, foreground, note=str(exc))
            raise
        build = program.build
        if build.hit:
            self._record(EventKind.STORE_HIT, spec, foreground, seconds=build.compile_s)
        elif build.fetched:
            note = f"fetched {build.blob_bytes} bytes instead of a {build.compile_s:.3f} s compile"
            self._record(EventKind.FETCHED, spec, foreground, seconds=build.fetch_s, note=note)
        else:
            note = ""
            if program.reused:
                note = "the graph another specialization compiled (no compile)"
            elif isinstance(program.compiled, HalvedCompiledModel):
                note = "as two halves side by side"
            self._record(
                EventKind.COMPILED,
                spec,
                foreground,
                seconds=build.compile_s,
                note=note,
                build_s=build.host_s,
            )
        # Not warmed: a prefill graph (its warm-up is a whole prompt chunk, which the prompt
        # pays anyway), a graph another one brought in, the first rung unless warm_first_rung.
        warm = self.warm_up and spec.phase is Phase.DECODE and not program.reused
        warm = warm and spec != self._unwarmed
        warm_s = warm_up(program.compiled) if warm else 0.0
        self._warmed = self._warmed or warm
        self._record(
            EventKind.LOADED,
            spec,
            foreground,
            seconds=program.import_s + warm_s,
            note=f"import {program.import_s:.3f} s, warm-up {warm_s:.3f} s",
        )
        with self._lock:
            self._programs[spec] = program
            self._pending.pop(spec, None)
        return program

    def _after_get(self, spec: Specialization) -> None:
        if self.policy is not Policy.ONE_AHEAD or spec.phase is not Phase.DECODE:
            return
        for successor, early_note in self._successors_to_queue(spec.capacity_tokens):
            if early_note:
                with self._lock:
                    already = successor in self._programs or successor in self._pending
                if not already:
                    self._record(EventKind.EARLY_START, successor, False, note=early_note)
            self.prefetch(successor)

    def _successors_to_queue(self, capacity_tokens: int) -> Sequence[tuple[Specialization, str]]:
        """The next rung, plus later ones the plan's rule says cannot wait (the same
        function ``ovspec plan`` simulates, so its predictions are the loader's)."""
        plan = self.window_plan
        picked = successors_to_start(
            self.ladder,
            capacity_tokens,
            plan.compile_s if plan is not None else {},
            plan.window_s if plan is not None else {},
            plan.rule if plan is not None else None,
        )
        top = self.reachable_top_tokens
        return [(Specialization.decode(c), note) for c, note in picked if c <= top]

    def _record(
        self,
        kind: EventKind,
        spec: Specialization,
        foreground: bool,
        seconds: float = 0.0,
        note: str = "",
        build_s: float = 0.0,
    ) -> None:
        event = LoaderEvent(
            kind, spec.label, self._clock() - self._opened_s, foreground, seconds, note, build_s
        )
        with self._lock:
            self._events.append(event)

    def _check_open(self) -> None:
        if self._closed:
            raise OvspecError("the loader is closed")


def _as_spec(spec: Specialization | int) -> Specialization:
    return Specialization.decode(spec) if isinstance(spec, int) else spec
