"""The device/host split on a CPU stand-in: decode and compile on disjoint cores.

Owns ``CoreSplit`` (which cores decode, which compile), pinning a process (every
thread) to a core set, and the ``HostBuilder``: a spawned process pinned to the host
cores that builds blobs into the store through the store's own ``get_or_create``
(per-key lock, publish), the way an NPU decodes while the host CPU compiles. The
decode process then imports what the host published.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovspec.compile.delegate import DelegatedBuild
from ovspec.errors import BadRequestError, CompileError, arg

if TYPE_CHECKING:  # not at run time: the host process pins itself before OpenVINO loads
    from ovspec.compile.compiler import Compiler
    from ovspec.ir.roles import ModelRoles
    from ovspec.ir.specialize import Specialization

# The property that bounds OpenVINO's inference threads: under the split it is the
# number of device cores, so the decode does not oversubscribe the one core it has.
THREADS_PROPERTY = "INFERENCE_NUM_THREADS"

_START_TIMEOUT_S = 120.0
_POLL_S = 0.5


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity where the OS keeps one), in order."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class CoreSplit:
    """Disjoint core sets: ``device`` decodes (the NPU's role), ``host`` compiles."""

    device: tuple[int, ...]
    host: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.device or not self.host:
            raise BadRequestError(
                f"a split needs at least one device core and one host core (got device "
                f"{list(self.device)}, host {list(self.host)})"
            )
        overlap = set(self.device) & set(self.host)
        if overlap:
            raise BadRequestError(f"device and host cores overlap on {sorted(overlap)}")
        usable = set(usable_cores())
        outside = (set(self.device) | set(self.host)) - usable
        if outside:
            raise BadRequestError(
                f"cores {sorted(outside)} are outside this process's affinity {sorted(usable)}"
            )

    @classmethod
    def default(cls) -> CoreSplit | None:
        """Half the usable cores (at least one) decode, the rest compile; None on a
        single core."""
        cores = usable_cores()
        if len(cores) < 2:
            return None
        half = max(1, len(cores) // 2)
        return cls(cores[:half], cores[half:])

    @classmethod
    def parse(cls, text: str) -> CoreSplit:
        """``DEVICE/HOST`` core lists, e.g. ``0/1`` or ``0,1/2,3``."""
        device, sep, host = text.partition("/")
        if not sep:
            raise BadRequestError(f"{arg('split', text)} takes DEVICE/HOST cores, e.g. 0/1")
        try:
            return cls(_cores(device), _cores(host))
        except ValueError as exc:
            raise BadRequestError(f"{arg('split', text)}: {exc}") from exc

    @property
    def decode_thread_only(self) -> bool:
        """Whether only the decode thread needs the device cores: with one device core
        OpenVINO infers on the calling thread alone; with several it also uses pool
        threads that cannot be told apart from the ones that import."""
        return len(self.device) == 1

    def describe(self) -> str:
        return f"device cores {_show(self.device)}, host cores {_show(self.host)}"

    def to_json(self) -> dict[str, list[int]]:
        return {"device": list(self.device), "host": list(self.host)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CoreSplit:
        return cls(tuple(data["device"]), tuple(data["host"]))


def _cores(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip())


def _show(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in cores)


def pin_process(cores: Iterable[int]) -> tuple[int, ...]:
    """Pin every thread of this process to ``cores`` (threads created later inherit it
    from their creator); returns the affinity the calling thread had."""
    wanted = set(cores)
    before = tuple(sorted(os.sched_getaffinity(0)))
    for tid in _task_ids():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, wanted)
    return before


class SplitPins:
    """Where the decode process's threads run under the split, kept as loads make more.

    With one device core (``CoreSplit.decode_thread_only``): the decode thread and the
    threads a graph's load made (OpenVINO's executors of that graph: NPUW runs each
    subgraph's inference on them, and its completion callbacks) on the device core;
    the process's Python threads (the loader's worker: imports, warm-ups; the host
    builder's queue) and OpenVINO's pool threads on the host cores; any other thread
    already on exactly the device core stays (made by the decode thread for its
    inference). With several device cores the whole process is on them.

    ``begin()`` pins once the loader's foreground is over (before, every core may load);
    ``loading()`` wraps each load and pins again after it: OpenVINO pins a thread that
    enters a graph's stream to that stream's cores (the loader's worker warming a graph
    up was left on the device core, and imported the next successors there), and a
    graph's executors are made with their creator's cores (the worker's, the host's).
    OpenVINO should have started with the whole mask: a thread entering its pool gets
    the mask it started with.
    """

    def __init__(self, split: CoreSplit, decode_tid: int) -> None:
        self.split = split
        self.decode_tid = decode_tid
        self._lock = threading.Lock()
        self._begun = False
        self._inference: set[int] = set()  # threads loads made, minus Python's

    def begin(self) -> None:
        """The split begins (once; later calls do nothing)."""
        with self._lock:
            if self._begun:
                return
            self._begun = True
        self.pin()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Around one load (import and warm-up): the threads it made serve its graph."""
        before = set(_task_ids())
        self.pin()
        try:
            yield
        finally:
            made = set(_task_ids()) - before - _python_thread_ids()
            with self._lock:
                self._inference |= made
            self.pin()

    def inference_threads(self) -> frozenset[int]:
        """The threads loads made that are alive still (the device's, once begun)."""
        with self._lock:
            return frozenset(self._inference & set(_task_ids()))

    def pin(self) -> None:
        """Every thread where the split wants it now (nothing before ``begin``)."""
        with self._lock:
            if not self._begun:
                return
            inference = set(self._inference)
        if not self.split.decode_thread_only:
            pin_process(self.split.device)
            return
        device = set(self.split.device)
        python = _python_thread_ids()
        for tid in _task_ids():
            with contextlib.suppress(ProcessLookupError, OSError):  # a thread that ended
                if tid == self.decode_tid or tid in inference:
                    os.sched_setaffinity(tid, device)
                elif tid in python or set(os.sched_getaffinity(tid)) != device:
                    os.sched_setaffinity(tid, self.split.host)


def _python_thread_ids() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def _task_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread only
        return [threading.get_native_id()]


def thread_affinities() -> dict[int, tuple[int, ...]]:
    """Thread id -> its affinity, for every thread of this process (Linux)."""
    out: dict[int, tuple[int, ...]] = {}
    for name in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, OSError):
            out[int(name)] = tuple(sorted(os.sched_getaffinity(int(name))))
    return out


@dataclass(frozen=True)
class _HostConfig:
    model_root: str
    models_folder: str
    device: str
    properties: dict[str, str]
    store_root: str
    compression: str
    blob_mode: str
    rewrites: str
    host_cores: tuple[int, ...]


class HostBuilder:
    """A spawned process pinned to the host cores that builds blobs into the store: the
    ``BuildDelegate`` of a ``Compiler`` under the split.

    Made before the compiler (which takes it at construction). ``spawn()`` starts the
    process without waiting for it (its Python and OpenVINO start while this process
    opens the device); ``start()`` or the first request waits until it is ready. The
    host builds one request at a time, in the order asked (one host compile keeps a
    core busy): ``request`` queues a build without waiting, ``build`` waits for it
    (queuing it if nobody did); both are thread-safe. ``close()`` stops the process.
    """

    def __init__(
        self,
        *,
        model_root: Path,
        models_folder: Path,
        device: str,
        properties: Mapping[str, str],
        store_root: Path,
        compression: str,
        blob_mode: str,
        rewrites: str,
        host_cores: tuple[int, ...],
        serve: Callable[[Any, Any, Any], None] | None = None,
    ) -> None:
        # The host process's body: ``serve_builds``, or a module-level function around it
        # (a spawned process imports it by name).
        self._serve = serve or serve_builds
        self._config = _HostConfig(
            str(model_root),
            str(models_folder),
            device,
            dict(properties),
            str(store_root),
            compression,
            blob_mode,
            rewrites,
            tuple(host_cores),
        )
        self.cores = self._config.host_cores
        self.pid: int | None = None  # the host process, once ready
        self.affinity: tuple[int, ...] = ()
        self._cond = threading.Condition()
        self._process: Any = None
        self._requests: Any = None
        self._replies: Any = None
        self._asked: set[str] = set()  # queued on the host, its answer not taken yet
        self._answers: dict[str, dict[str, Any]] = {}  # read, for the thread that asked
        self._reading = False  # a thread is reading the host's next answer

    def spawn(self) -> HostBuilder:
        """Start the host process without waiting for it (once)."""
        with self._cond:
            self._spawn_locked()
        return self

    def start(self) -> HostBuilder:
        """Start the host process if nobody did and wait until it is ready (once)."""
        with self._cond:
            self._start_locked()
        return self

    def _spawn_locked(self) -> None:
        if self._process is not None:
            return
        # Spawn, not fork: this process has OpenVINO (and its thread pools) loaded.
        context = multiprocessing.get_context("spawn")
        self._requests = context.Queue()
        self._replies = context.Queue()
        process = context.Process(
            target=self._serve,
            args=(self._config, self._requests, self._replies),
            name="ovspec-host-builder",
            daemon=True,
        )
        process.start()  # on failure nothing is kept: close() must not join an unstarted one
        self._process = process

    def _start_locked(self) -> None:
        self._spawn_locked()
        if self.pid is None:
            ready = self._reply(_START_TIMEOUT_S, "start")
            if "error" in ready:
                raise CompileError(f"host build: {ready['error']}")
            self.pid = int(ready["pid"])
            self.affinity = tuple(ready["affinity"])

    def request(self, spec: Specialization) -> None:
        with self._cond:
            self._ask_locked(spec.label, _build_message(spec))

    def build(self, spec: Specialization) -> DelegatedBuild:
        with self._cond:
            self._ask_locked(spec.label, _build_message(spec))
            reply = self._answer_locked(spec.label, "build")
        return DelegatedBuild(**{**reply["build"], "affinity": tuple(reply["build"]["affinity"])})

    def roles(self) -> ModelRoles:
        """The model's roles, prepared on the host (the decode process never reads the IR)."""
        from ovspec.ir.roles import ModelRoles

        with self._cond:
            self._ask_locked(_ROLES, (_ROLES,))
            reply = self._answer_locked(_ROLES, "roles")
        return ModelRoles.from_json(reply["roles"])

    def _ask_locked(self, label: str, message: tuple[Any, ...]) -> None:
        self._start_locked()
        if label not in self._asked:
            self._asked.add(label)
            self._requests.put(message)

    def _answer_locked(self, label: str, what: str) -> dict[str, Any]:
        """The host's answer to ``label``; answers come in the order asked, so a thread
        may read others' first (one thread reads at a time, the rest wait)."""
        while label not in self._answers:
            if self._reading:
                self._cond.wait()
                continue
            self._reading = True
            self._cond.release()
            try:
                reply = self._reply(None, what)
            finally:
                self._cond.acquire()
                self._reading = False
                self._cond.notify_all()
            self._answers[reply["label"]] = reply
        self._asked.discard(label)
        reply = self._answers.pop(label)
        if "error" in reply:
            raise CompileError(f"host build: {reply['error']}")
        return reply

    def _reply(self, timeout_s: float | None, what: str) -> dict[str, Any]:
        began = time.monotonic()
        while True:
            try:
                reply: dict[str, Any] = self._replies.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    raise CompileError(
                        f"the host build process died (exit {self._process.exitcode}) during {what}"
                    ) from None
                if timeout_s is not None and time.monotonic() - began > timeout_s:
                    raise CompileError(
                        f"the host build process did not {what} in {timeout_s} s"
                    ) from None
                continue
            return reply

    def close(self) -> None:
        if self._process is None:
            return
        with contextlib.suppress(Exception):
            self._requests.put(None)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()  # the process this object started, by its handle
            self._process.join()
        self._requests.close()
        self._replies.close()


_ROLES = "roles"  # the label of the roles request and its answer


def _build_message(spec: Specialization) -> tuple[Any, ...]:
    """What the host process is sent to build ``spec`` (``serve_builds`` reads it back)."""
    return ("build", spec.phase.value, spec.capacity_tokens, spec.chunk_tokens)


def serve_builds(
    config: _HostConfig,
    requests: Any,
    replies: Any,
    around_builds: Callable[[Compiler], contextlib.AbstractContextManager[object]] | None = None,
) -> None:
    """The host process: pin first (before OpenVINO makes threads), then build on request;
    ``around_builds(compiler)`` is open while it serves (e.g. the runtime's weight-page
    trimmer: this layer knows nothing of it)."""
    pin_process(config.host_cores)
    try:
        from ovspec.compile.compiler import Compiler
        from ovspec.compile.modes import BlobMode
        from ovspec.ir.compression import Compression
        from ovspec.ir.model_dir import resolve_model
        from ovspec.ir.rewrites import RewriteSet
        from ovspec.store.local import Store

        store = Store(config.store_root)
        compiler = Compiler(
            resolve_model(config.model_root, Path(config.models_folder)),
            config.device,
            config.properties,
            store,
            compression=Compression.parse(config.compression),
            blob_mode=BlobMode(config.blob_mode),
            rewrites=RewriteSet.parse(config.rewrites),
        )
    except Exception as exc:  # reported to the decode process, which raises it
        replies.put({"error": f"could not start: {exc}"})
        return
    with around_builds(compiler) if around_builds else contextlib.nullcontext():
        replies.put({"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))})
        _serve_requests(compiler, requests, replies)
    compiler.close()
    store.close()


def _serve_requests(compiler: Compiler, requests: Any, replies: Any) -> None:
    from ovspec.ir.specialize import Phase, Specialization

    while (request := requests.get()) is not None:
        label = _ROLES
        try:
            if request[0] == _ROLES:
                replies.put({"label": label, "roles": compiler.roles().to_json()})
                continue
            _, phase, capacity, chunk = request
            spec = Specialization(Phase(phase), capacity, chunk)
            label = spec.label
            began = time.perf_counter()
            outcome = compiler.build(spec)
            build = {
                "spec": spec.label,
                "hit": outcome.hit,
                "compile_s": outcome.compile_s,
                "export_s": outcome.export_s,
                "wait_s": outcome.wait_s,
                "host_s": time.perf_counter() - began,
                "pid": os.getpid(),
                "affinity": sorted(os.sched_getaffinity(0)),
            }
            replies.put({"label": label, "build": build})
        except Exception as exc:
            replies.put({"label": label, "error": str(exc)})
