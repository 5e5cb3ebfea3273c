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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovspec.compile.delegate import DelegatedBuild
from ovspec.errors import BadRequestError, CompileError, arg

if TYPE_CHECKING:  # not at run time: the host process pins itself before OpenVINO loads
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


def pin_split(split: CoreSplit, decode_tid: int) -> None:
    """The decode thread on the device cores, every other thread of this process on
    the host cores (with one device core; with several, the whole process stays on the
    device cores, see ``CoreSplit.decode_thread_only``).

    OpenVINO's CPU plugin builds an imported model's graph (weight unpacking and
    repacking) on its own pool threads, which the process made before any load: pinned
    with the process to the device core, a successor's import ran there, beside the
    decode. With one device core inference runs on the thread that calls ``infer``
    (``INFERENCE_NUM_THREADS`` = 1), so everything else can move to the host. Called
    again around every load: threads OpenVINO creates later inherit their creator's
    cores, which may be the decode thread's. OpenVINO should have started before this
    with the whole mask: a thread entering its pool gets the mask it started with.
    A thread already on exactly the device cores stays there: only the decode thread
    made it (every other is moved at the first call), for its inference (NPUW's CPU
    subdevices run each subgraph on a thread made at its first inference; moved to the
    host, a rung's decode ran beside the successor's import there).
    """
    if not split.decode_thread_only:
        pin_process(split.device)
        return
    device = set(split.device)
    for tid in _task_ids():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            if tid != decode_tid and set(os.sched_getaffinity(tid)) == device:
                continue  # made by the decode thread since the split began: see above
            os.sched_setaffinity(tid, split.device if tid == decode_tid else split.host)


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

    Made before the compiler (which takes it at construction), started by ``start()``
    or its first request, so a device the compiler refuses spawns nothing. ``build`` is
    thread-safe and serial (one host compile at a time, as one host compile keeps a
    core busy). ``close()`` stops the process.
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
    ) -> None:
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
        self.pid: int | None = None  # the host process, once started
        self.affinity: tuple[int, ...] = ()
        self._lock = threading.Lock()
        self._process: Any = None
        self._requests: Any = None
        self._replies: Any = None

    def start(self) -> HostBuilder:
        """Spawn the host process and wait until it is ready (once)."""
        with self._lock:
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        if self._process is not None:
            return
        # Spawn, not fork: this process has OpenVINO (and its thread pools) loaded.
        context = multiprocessing.get_context("spawn")
        self._requests = context.Queue()
        self._replies = context.Queue()
        self._process = context.Process(
            target=_serve,
            args=(self._config, self._requests, self._replies),
            name="ovspec-host-builder",
            daemon=True,
        )
        self._process.start()
        ready = self._reply(_START_TIMEOUT_S, "start")
        self.pid = int(ready["pid"])
        self.affinity = tuple(ready["affinity"])

    def build(self, spec: Specialization) -> DelegatedBuild:
        with self._lock:
            self._start_locked()
            self._requests.put(("build", spec.phase.value, spec.capacity_tokens, spec.chunk_tokens))
            reply = self._reply(None, "build")
        return DelegatedBuild(**{**reply["build"], "affinity": tuple(reply["build"]["affinity"])})

    def roles(self) -> ModelRoles:
        """The model's roles, prepared on the host (the decode process never reads the IR)."""
        from ovspec.ir.roles import ModelRoles

        with self._lock:
            self._start_locked()
            self._requests.put(("roles",))
            reply = self._reply(None, "roles")
        return ModelRoles.from_json(reply["roles"])

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
            if "error" in reply:
                raise CompileError(f"host build: {reply['error']}")
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


def _serve(config: _HostConfig, requests: Any, replies: Any) -> None:
    """The host process: pin first (before OpenVINO makes threads), then build on request."""
    pin_process(config.host_cores)
    try:
        from ovspec.compile.compiler import Compiler
        from ovspec.compile.modes import BlobMode
        from ovspec.ir.compression import Compression
        from ovspec.ir.model_dir import resolve_model
        from ovspec.ir.rewrites import RewriteSet
        from ovspec.ir.specialize import Phase, Specialization
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
    replies.put({"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))})
    while (request := requests.get()) is not None:
        try:
            if request[0] == "roles":
                replies.put({"roles": compiler.roles().to_json()})
                continue
            _, phase, capacity, chunk = request
            spec = Specialization(Phase(phase), capacity, chunk)
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
            replies.put({"build": build})
        except Exception as exc:
            replies.put({"error": str(exc)})
    compiler.close()
    store.close()
