"""The device/host split: core sets, pinning, the host build process and the decode's
imports through the store (tiny model; no timed assertions)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest

import ovspec.runtime.decoding as runtime
from ovspec.compile.devices import NpuwProfile
from ovspec.compile.split import (
    CoreSplit,
    HostBuilder,
    SplitPins,
    pin_process,
    thread_affinities,
    usable_cores,
)
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.loader import EventKind
from ovspec.store.local import Store

MODEL = Path(__file__).parents[1] / "data" / "qwen2"
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]

needs_two_cores = pytest.mark.skipif(len(usable_cores()) < 2, reason="the split needs 2 cores")


def test_core_split_validates_and_parses() -> None:
    cores = usable_cores()
    with pytest.raises(BadRequestError, match="overlap"):
        CoreSplit((cores[0],), (cores[0],))
    with pytest.raises(BadRequestError, match="at least one device core"):
        CoreSplit((), (cores[0],))
    with pytest.raises(BadRequestError, match="outside this process's affinity"):
        CoreSplit((cores[0],), (max(cores) + 1000,))
    with pytest.raises(BadRequestError, match="DEVICE/HOST"):
        CoreSplit.parse("0,1")
    if len(cores) >= 2:
        split = CoreSplit.parse(f"{cores[0]}/{cores[1]}")
        assert split == CoreSplit((cores[0],), (cores[1],))
        assert CoreSplit.from_json(split.to_json()) == split
        default = CoreSplit.default()
        assert default is not None
        assert set(default.device) | set(default.host) == set(cores)
        assert not set(default.device) & set(default.host)


def test_split_refuses_compile_mode(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="needs load_mode=import"):
        runtime.open(
            MODEL,
            ladder="32,64",
            store=tmp_path / "s",
            load_mode="compile",
            tuning=runtime.Tuning(split=True),
        )


@needs_two_cores
def test_split_pins_builds_on_the_host_and_decodes_the_same_tokens(tmp_path: Path) -> None:
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    before = os.sched_getaffinity(0)
    # Exact f32 on both paths: at a bf16 default, graphs cut or compiled differently
    # round differently, and the fixture's random logits have near-ties.
    exact = dict(EXACT_CPU_PROPERTIES)
    with runtime.open(
        MODEL,
        ladder="32,64,128",
        store=tmp_path / "split",
        properties=exact,
        tuning=runtime.Tuning(split=split),
    ) as loader:
        builder = loader._compiler.delegate  # the host process, started by open
        assert isinstance(builder, HostBuilder) and builder.pid is not None
        assert builder.pid != os.getpid() and builder.affinity == split.host
        assert os.sched_getaffinity(0) == before  # the foreground may use every core
        assert loader.properties["INFERENCE_NUM_THREADS"] == "1"
        result = runtime.decode(loader, PROMPT, max_new_tokens=70)
        # The decode thread is on the device core, with the threads the loads made to
        # run their graphs (SplitPins) and those the decode thread made for its
        # inference; every Python thread (the loader's worker: waiting for the host,
        # importing) is on the host cores, as are OpenVINO's pool threads (building an
        # imported graph).
        affinities = thread_affinities()
        me = threading.get_native_id()
        assert affinities.pop(me) == split.device
        python_threads = {t.native_id for t in threading.enumerate()} - {me}
        assert python_threads & set(affinities)  # the loader's worker at least
        for tid in python_threads & set(affinities):
            assert affinities[tid] == split.host, (tid, affinities[tid])
        assert split.host in set(affinities.values())
    assert os.sched_getaffinity(0) == before  # restored on close
    compiled = [e for e in result.events if e.kind is EventKind.COMPILED]
    assert {e.spec for e in compiled} >= {"decode@32", "decode@64", "decode@128"}
    assert all(e.build_s >= e.seconds > 0 for e in compiled)  # the host's whole build
    # The host published every graph into the store; this process imported them.
    with Store(tmp_path / "split") as store:
        assert len(store.entries()) == len({e.spec for e in compiled})
    with runtime.open(
        MODEL, ladder="32,64,128", store=tmp_path / "plain", properties=exact
    ) as loader:
        plain = runtime.decode(loader, PROMPT, max_new_tokens=70)
    assert result.token_ids == plain.token_ids
    assert result.rungs == plain.rungs == (32, 64, 128)


@needs_two_cores
def test_the_host_builds_the_prompts_graph_first(tmp_path: Path) -> None:
    """One host builds in the order asked: the prompt's graph before the first rung's
    decode graph, which the worker asks for at the same moment (it used to win the race
    most times, and the prompt waited for both builds)."""
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    with runtime.open(
        MODEL, ladder="32,64", store=tmp_path / "s", tuning=runtime.Tuning(split=split)
    ) as loader:
        runtime.decode(loader, PROMPT, max_new_tokens=4)
        built = [e.spec for e in loader.events if e.kind is EventKind.COMPILED]
    assert built[:2] == ["prefill@32x32", "decode@32"]


@needs_two_cores
def test_split_pins_put_the_decode_thread_on_the_device_and_the_rest_on_the_host() -> None:
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    assert split.decode_thread_only
    started, stop = threading.Event(), threading.Event()
    tids: list[int] = []

    def other() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait()

    thread = threading.Thread(target=other)
    thread.start()
    started.wait()
    before = pin_process(cores)
    pins = SplitPins(split, threading.get_native_id())
    try:
        pins.pin()  # before the split begins: nothing moves
        assert os.sched_getaffinity(tids[0]) == set(cores)
        pins.begin()
        assert os.sched_getaffinity(0) == set(split.device)
        assert os.sched_getaffinity(tids[0]) == set(split.host)
        # A thread the decode thread creates inherits the device cores until the next pin.
        late: list[set[int]] = []
        probe = threading.Thread(target=lambda: late.append(os.sched_getaffinity(0)))
        probe.start()
        probe.join()
        assert late == [set(split.device)]
        # A native thread a load makes serves that graph's inference: on the device
        # cores after the load, wherever it was made. A Python thread another library
        # moved to the device cores (OpenVINO re-pins the loader's worker that warms a
        # graph up) goes back to the host.
        with pins.loading():
            made, end_native = native_thread()
            os.sched_setaffinity(made, split.host)  # as if the worker had made it
            os.sched_setaffinity(tids[0], split.device)
        try:
            assert pins.inference_threads() == {made}
            assert os.sched_getaffinity(made) == set(split.device)
            assert os.sched_getaffinity(tids[0]) == set(split.host)
        finally:
            end_native()
    finally:
        stop.set()
        thread.join()
        pin_process(before)


def native_thread() -> tuple[int, Callable[[], None]]:
    """A thread no Python code runs on (blocked in ``pause()``, as OpenVINO's idle
    executors wait): its id, and a function that ends it."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = set(os.listdir("/proc/self/task"))
    handle = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(handle), None, libc.pause, None) == 0
    (made,) = set(os.listdir("/proc/self/task")) - before

    def end() -> None:
        libc.pthread_cancel(handle)  # pause() is a cancellation point
        libc.pthread_join(handle, None)

    return int(made), end


@needs_two_cores
def test_a_successor_imports_off_the_decode_core(tmp_path: Path) -> None:
    """One-ahead under the split: after the successor loaded in the background, no
    thread but the decode thread and the executors the loads made for their graphs may
    run on the device core (OpenVINO's pool threads build an imported graph; they used
    to stay pinned beside the decode)."""
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    with runtime.open(
        MODEL,
        ladder="32,64",
        store=tmp_path / "s",
        policy="one_ahead",
        tuning=runtime.Tuning(split=split),
    ) as loader:
        loader.start(32)
        loader.get(32)  # queues decode@64 on the worker
        loader.get(64)  # waits for it
        affinities = thread_affinities()
        assert affinities.pop(threading.get_native_id()) == split.device
        made = loader._pins.inference_threads() if loader._pins is not None else frozenset()
        assert {affinities.pop(t) for t in made} <= {split.device}
        assert set(affinities.values()) == {split.host}
        assert loader.worker_cores == split.host


def test_a_host_process_that_fails_to_start_keeps_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing.process

    def refuse(self: object) -> None:
        raise RuntimeError("spawn refused")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    builder = HostBuilder(
        model_root=MODEL,
        models_folder=tmp_path / "models",
        device="CPU",
        properties=EXACT_CPU_PROPERTIES,
        store_root=tmp_path / "s",
        compression="none",
        blob_mode="full",
        rewrites="",
        host_cores=(0,),
    )
    with pytest.raises(RuntimeError, match="spawn refused"):
        builder.start()
    builder.close()  # nothing started: nothing to stop, and no error of its own


@needs_two_cores
def test_npuw_rungs_infer_on_the_device_cores_whoever_imported_them(tmp_path: Path) -> None:
    """NPUW runs each subgraph's inference (and its completion callback) on executor
    threads its graph's load made: on the loader's worker, pinned to the host. After the
    successors loaded, the threads that run a rung's inference are on the device core,
    and the worker, which OpenVINO re-pins when it warms a graph up, is on the host."""
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    # test_npuw.py's exact properties: graphs of one weights file share an NPUW weights
    # bank in a process, which asserts on graphs folded otherwise.
    npuw = {"NPUW_DEVICES": "CPU", **NpuwProfile.exact_properties}
    with runtime.open(
        MODEL,
        ladder="32,64,128",
        device="NPU",
        properties=npuw,
        store=tmp_path / "s",
        policy="one_ahead",
        tuning=runtime.Tuning(split=split),
    ) as loader:
        loader.start(32)
        graphs = [loader.get(32), loader.get(64)]  # the worker loaded both, and 128
        loader.load_now(128)
        workers = [t.native_id or 0 for t in threading.enumerate() if t.name.startswith("ovspec")]
        affinities = thread_affinities()
        assert workers and {affinities[w] for w in workers} == {split.host}
        for compiled in graphs:
            spent = _cpu_s_by_thread_over_infers(compiled, times=50)
            decode_s = spent.pop(threading.get_native_id())
            # More than a trace of the decode thread's own time (callbacks on the host
            # core took ~4% of it).
            # Python threads serve no inference (OpenVINO's executors are native threads):
            # ovspec's (the loader's worker, the weight-page trimmer polling /proc) are the
            # host's, checked above, and another test's may still be winding down.
            python = {t.native_id for t in threading.enumerate()}
            serving = {t for t, s in spent.items() if s > 0.01 * decode_s and t not in python}
            assert serving, "NPUW ran no subgraph off the calling thread"
            off = {
                _thread_name(t): thread_affinities().get(t)
                for t in serving
                if thread_affinities().get(t) != split.device
            }
            assert not off, f"inference threads off the device core: {off}"


def _thread_name(tid: int) -> str:
    try:
        return f"{tid}:{Path(f'/proc/self/task/{tid}/comm').read_text().strip()}"
    except OSError:
        return str(tid)


def _cpu_s_by_thread_over_infers(compiled: Any, times: int) -> dict[int, float]:
    """CPU seconds each thread of this process spent over ``times`` inferences of
    ``compiled`` on this thread (schedstat), after one unmeasured."""
    request = compiled.create_infer_request()
    for port in compiled.inputs:
        shape = [d.get_min_length() if d.is_dynamic else d.get_length() for d in port.partial_shape]
        request.set_tensor(port, ov.Tensor(np.zeros(shape, port.element_type.to_dtype())))
    request.infer()  # its first inference's one-time work, outside the measure
    before = _thread_cpu_s()
    for _ in range(times):
        request.infer()
    return {t: s - before.get(t, 0.0) for t, s in _thread_cpu_s().items()}


def _thread_cpu_s() -> dict[int, float]:
    out = {}
    for name in os.listdir("/proc/self/task"):
        with (
            contextlib.suppress(OSError, ValueError),
            open(f"/proc/self/task/{name}/schedstat") as f,
        ):
            out[int(name)] = int(f.read().split()[0]) / 1e9  # unless it just ended
    return out
