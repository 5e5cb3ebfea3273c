"""The device/host split: core sets, pinning, the host build process and the decode's
imports through the store (tiny model; no timed assertions)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import ovspec.runtime.decoding as runtime
from ovspec.compile.split import (
    CoreSplit,
    HostBuilder,
    pin_process,
    pin_split,
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
        # The decode thread alone is on the device core: the loader's worker (waiting
        # for the host, importing) and OpenVINO's pool threads (building an imported
        # graph) are on the host cores.
        affinities = thread_affinities()
        me = threading.get_native_id()
        assert affinities.pop(me) == split.device
        assert affinities and set(affinities.values()) == {split.host}
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
def test_pin_split_puts_the_decode_thread_on_the_device_and_the_rest_on_the_host() -> None:
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
    try:
        pin_split(split, threading.get_native_id())
        assert os.sched_getaffinity(0) == set(split.device)
        assert os.sched_getaffinity(tids[0]) == set(split.host)
        # A thread the decode thread creates inherits the device cores until the next pin.
        late: list[set[int]] = []
        probe = threading.Thread(target=lambda: late.append(os.sched_getaffinity(0)))
        probe.start()
        probe.join()
        assert late == [set(split.device)]
        # A pin around a later load leaves such a thread there (it serves the decode's
        # inference: NPUW's subdevice threads) and moves a thread on every core.
        made, go = threading.Event(), threading.Event()
        inference: list[int] = []

        def serves_the_decode() -> None:
            inference.append(threading.get_native_id())
            made.set()
            go.wait()

        kept = threading.Thread(target=serves_the_decode)
        kept.start()
        made.wait()
        os.sched_setaffinity(tids[0], set(cores))
        try:
            pin_split(split, threading.get_native_id())
            assert os.sched_getaffinity(inference[0]) == set(split.device)
            assert os.sched_getaffinity(tids[0]) == set(split.host)
        finally:
            go.set()
            kept.join()
    finally:
        stop.set()
        thread.join()
        pin_process(before)


@needs_two_cores
def test_a_successor_imports_off_the_decode_core(tmp_path: Path) -> None:
    """One-ahead under the split: after the successor loaded in the background, no
    thread but the decode thread may run on the device core (OpenVINO's pool threads
    build an imported graph; they used to stay pinned beside the decode)."""
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
        assert set(affinities.values()) == {split.host}
        assert loader.worker_cores == split.host
