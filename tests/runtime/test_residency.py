"""The IR's mapped weights are mapped in ahead of the first graph's packing, leave the
resident set once graphs have packed them, only this loader's read-only mapping is
touched, and decoding gives the same tokens."""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_until

from ovspec.compile.devices import profile_for
from ovspec.compile.modes import LoadMode
from ovspec.errors import MappingError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import prefill_specialization
from ovspec.runtime import residency, vmem
from ovspec.runtime.decoding import Tuning, decode
from ovspec.runtime.decoding import open as open_loader
from ovspec.runtime.loader import Loader
from ovspec.runtime.residency import (
    MADV_POPULATE_READ,
    MappedRange,
    WeightPageTrimmer,
    WeightPrefault,
    mapping_at,
)
from ovspec.store.local import Store

needs_madvise = pytest.mark.skipif(
    WeightPageTrimmer.unsupported_reason() is not None,
    reason=f"no page mapping here: {WeightPageTrimmer.unsupported_reason()}",
)


def test_mapping_at_reads_the_line_holding_the_address() -> None:
    maps = "\n".join(
        [
            "7f0000000000-7f0000100000 r--s 00000000 08:01 12 /m/w eights.bin",
            "7f0000200000-7f0000201000 rw-p 00000000 08:01 12 /m/w eights.bin",
            "7f0000500000-7f0000600000 rw-p 00000000 00:00 0 ",
        ]
    )
    assert mapping_at(0x7F0000000010, maps) == MappedRange(
        0x7F0000000000, 0x100000, False, "/m/w eights.bin"
    )
    assert mapping_at(0x7F0000200FFF, maps) == MappedRange(
        0x7F0000200000, 0x1000, True, "/m/w eights.bin"
    )
    assert mapping_at(0x7F0000500000, maps) == MappedRange(0x7F0000500000, 0x100000, True, "")
    assert mapping_at(0x7F0000100000, maps) is None  # the end is exclusive


def _resident_bytes_at(address: int) -> int:
    with open("/proc/self/maps") as f:
        found = mapping_at(address, f.read())
    assert found is not None
    return vmem.smaps_rss_bytes([(found.address, found.size_bytes)])


@needs_madvise
def test_drop_empties_a_read_only_mapping_and_reads_come_back(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(1 << 20))
    weights = np.memmap(path, dtype=np.uint8, mode="r")
    address = int(weights.ctypes.data)
    before = bytes(weights[:8192])
    trimmer = WeightPageTrimmer.for_weights(path, lambda: address)
    assert trimmer.step_mib == pytest.approx(0.25)  # the floor: an eighth would be 1/8 MiB
    assert _resident_bytes_at(address) > 0
    assert trimmer.drop() == 1 << 20
    assert _resident_bytes_at(address) == 0
    assert bytes(weights[:8192]) == before  # faulted back from the page cache
    assert trimmer.drops == 1


@needs_madvise
def test_drop_leaves_what_is_not_a_read_only_mapping_of_the_weights(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x01" * (1 << 16))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as written:
        written[0] = 7  # a shared writable mapping: its pages must stay
        address = int(np.frombuffer(written, np.uint8).ctypes.data)
        assert WeightPageTrimmer(path, lambda: address).drop() == 0
        assert written[0] == 7 and _resident_bytes_at(address) > 0
    heap = np.ones(1 << 16, np.uint8)  # anonymous memory
    assert WeightPageTrimmer(path, lambda: int(heap.ctypes.data)).drop() == 0
    assert heap.all()
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x02" * (1 << 16))
    elsewhere = np.memmap(other, dtype=np.uint8, mode="r")  # read-only, another file
    assert WeightPageTrimmer(path, lambda: int(elsewhere.ctypes.data)).drop() == 0
    assert WeightPageTrimmer(path, lambda: None).drop() == 0  # the model is not read yet


def _weights_file(tmp_path: Path, size: int = 1 << 20) -> tuple[Path, np.memmap, int]:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(size))
    weights = np.memmap(path, dtype=np.uint8, mode="r")
    return path, weights, int(weights.ctypes.data)


def _skip_without_populate_read(address: int) -> None:
    try:
        vmem.advise(address, mmap.PAGESIZE, MADV_POPULATE_READ)
    except MappingError as exc:
        pytest.skip(f"this kernel has no MADV_POPULATE_READ (Linux >= 5.14): {exc}")


@needs_madvise
def test_the_prefault_maps_every_page_of_the_weights_in(tmp_path: Path) -> None:
    path, _mapped, address = _weights_file(tmp_path)
    _skip_without_populate_read(address)
    assert WeightPageTrimmer(path, lambda: address).drop() == 1 << 20
    assert _resident_bytes_at(address) == 0
    prefault = WeightPrefault(path, lambda: address)
    prefault.CHUNK_BYTES = 256 << 10  # four chunks
    prefault.start()
    prefault.join()
    assert prefault.populated_bytes == 1 << 20
    assert _resident_bytes_at(address) == 1 << 20
    # Stopped (the loader closing) before it begins: nothing more is advised.
    assert WeightPageTrimmer(path, lambda: address).drop() == 1 << 20
    stopped = WeightPrefault(path, lambda: address)
    stopped.stop()
    stopped.start()
    stopped.join()
    assert stopped.populated_bytes == 0 and _resident_bytes_at(address) == 0


@needs_madvise
def test_the_prefault_leaves_what_is_not_the_weights_and_never_raises(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x01" * (1 << 16))
    heap = np.ones(1 << 16, np.uint8)

    def broken() -> int:
        raise RuntimeError("the preparation failed")

    for where in (lambda: int(heap.ctypes.data), lambda: None, broken):
        prefault = WeightPrefault(path, where)
        prefault.start()
        prefault.join()
        assert prefault.populated_bytes == 0
    assert heap.all()


@needs_madvise
def test_the_trimmer_drops_as_it_starts_without_waiting_for_growth(tmp_path: Path) -> None:
    path, weights, address = _weights_file(tmp_path)
    assert int(weights.sum()) > 0 and _resident_bytes_at(address) == 1 << 20
    # Built after the pages came in, polling once a minute: only a drop at start can
    # empty the mapping within the test.
    trimmer = WeightPageTrimmer(path, lambda: address, poll_s=60.0)
    trimmer.start()
    deadline = time.monotonic() + 5.0
    while _resident_bytes_at(address) and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    assert _resident_bytes_at(address) == 0
    assert trimmer.drops == 1


def _open(
    tiny_dir: Path,
    store: Store,
    trim: bool,
    policy: str = "one_ahead",
    load_mode: str = "compile",  # rung graphs hold packed copies of the weights
) -> Loader:
    return open_loader(
        tiny_dir,
        ladder="64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        prefill_chunk_tokens=16,
        tuning=Tuning(trim_weight_pages=trim),
        policy=policy,
        load_mode=load_mode,
    )


def _trimming() -> bool:
    return any(t.name == "ovspec-weight-pages" for t in threading.enumerate())


def _prefaulting() -> bool:
    return any(t.name == "ovspec-weight-prefault" for t in threading.enumerate())


def test_the_prefault_starts_for_a_lazy_start_only(
    tiny_dir: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(WeightPrefault, "start", lambda self: started.append(self.name))
    for policy, expected in (("one_ahead", 1), ("eager", 0)):
        started.clear()
        with _open(tiny_dir, store, True, policy=policy):
            pass
        # An eager start packs every rung with its trimmer running: nothing to prefault.
        assert len(started) == expected, policy
    started.clear()
    with _open(tiny_dir, store, False):
        assert started == []  # only with the trimmer (CPU graphs from the IR)


def _weights_size(tiny_dir: Path) -> int:
    return (tiny_dir / "openvino_model.bin").stat().st_size


def _decode_and_measure(
    tiny_dir: Path, store: Store, trim: bool, prompt: list[int]
) -> tuple[list[int], int]:
    """Tokens, and the resident bytes of the loader's own mapping of the .bin after the
    decode (waiting for the trimmer to drop them, 30 s at most)."""
    with _open(tiny_dir, store, trim) as loader:
        result = decode(loader, prompt, max_new_tokens=80)
        address = loader._compiler.mapped_weights_address()  # the trimmer's anchor
        assert address is not None
        # The trimmer counts its pages once a second when nothing moves RssFile; its
        # thread may wait its turn on a loaded machine.
        deadline = time.monotonic() + 30.0
        resident = _resident_bytes_at(address)
        small = max(_weights_size(tiny_dir) // 8, 1 << 18)
        while trim and resident > small and time.monotonic() < deadline:
            time.sleep(0.05)
            resident = _resident_bytes_at(address)
    assert not _trimming()
    return list(result.token_ids), resident


@needs_madvise
def test_decode_drops_the_weights_pages_and_keeps_its_tokens(tiny_dir: Path, store: Store) -> None:
    prompt = np.random.default_rng(5).integers(3, 2048, 40).tolist()
    kept_tokens, kept_resident = _decode_and_measure(tiny_dir, store, False, prompt)
    # The control: without the trimmer the packed weights' pages stay resident.
    size = _weights_size(tiny_dir)
    assert kept_resident > size // 2
    tokens, resident = _decode_and_measure(tiny_dir, store, True, prompt)
    assert resident <= max(size // 8, 1 << 18)
    assert tokens == kept_tokens


@needs_madvise
def test_the_trimmer_waits_out_the_start_and_begins_at_the_first_decode(
    tiny_dir: Path, store: Store
) -> None:
    with _open(tiny_dir, store, True) as loader:
        loader.start(64)  # the first graph compiles and the prompt would run: no dropping
        loader.get(prefill_specialization(64, 16))
        assert not _trimming()
        loader.get(64)  # the first decode step's graph: the start is over
        assert _trimming()
    assert not _trimming() and not _prefaulting()  # both end with the loader
    with _open(tiny_dir, store, True, policy="eager") as loader:
        loader.start(64)  # eager packs every rung before the prompt: dropping from then
        assert _trimming()
    assert not _trimming()


@needs_madvise
def test_an_import_mode_start_begins_trimming_before_the_prompt(
    tiny_dir: Path, store: Store
) -> None:
    """Imported graphs read their weights through WEIGHTS_PATH, never the IR's mapping:
    its pages can go before the prompt runs, where the start's memory peaks."""
    with _open(tiny_dir, store, True, load_mode="import") as loader:
        assert not _trimming()
        loader.start(64)
        assert _trimming()
        loader.get(prefill_specialization(64, 16))
    assert not _trimming()


@needs_madvise
def test_the_trimmer_sees_its_own_pages_come_back_when_rss_file_does_not_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another mapping going away (another loader's, a freed model's) can cancel this
    # mapping's growth out in the process-wide RssFile: a flat RssFile stands for it.
    path, weights, address = _weights_file(tmp_path)
    monkeypatch.setattr(residency, "file_rss_mib", lambda: 100.0)
    trimmer = WeightPageTrimmer.for_weights(path, lambda: address)
    trimmer.poll_s, trimmer.check_s = 0.01, 3600.0  # no check of its own yet
    trimmer.start()
    try:
        wait_until(lambda: trimmer.drops == 1, "the first drop", 5.0)
        assert int(weights.sum()) > 0  # the pages come back, RssFile stays flat
        time.sleep(0.1)  # polls with RssFile flat: nothing prompts a count
        assert trimmer.drops == 1 and _resident_bytes_at(address) == 1 << 20
        trimmer.check_s = 0.05  # now its periodic count is due
        wait_until(
            lambda: trimmer.drops == 2 and _resident_bytes_at(address) == 0, "the second drop", 5.0
        )
    finally:
        trimmer.stop()
    assert trimmer.drops == 2 and _resident_bytes_at(address) == 0


@needs_madvise
def test_without_pagemap_the_trimmer_drops_on_rss_file_growth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, weights, address = _weights_file(tmp_path)
    rss = [100.0]
    monkeypatch.setattr(residency, "file_rss_mib", lambda: rss[0])
    monkeypatch.setattr(vmem, "present_bytes", lambda addr, size: None)
    trimmer = WeightPageTrimmer.for_weights(path, lambda: address)
    trimmer.poll_s, trimmer.check_s = 0.01, 0.01
    trimmer.start()
    try:
        wait_until(lambda: trimmer.drops == 1, "the first drop", 5.0)
        assert int(weights.sum()) > 0
        time.sleep(0.1)  # polls with a flat RssFile: no drop
        assert trimmer.drops == 1 and _resident_bytes_at(address) == 1 << 20
        rss[0] += trimmer.step_mib
        wait_until(lambda: trimmer.drops == 2, "the second drop", 5.0)
    finally:
        trimmer.stop()
    assert _resident_bytes_at(address) == 0


@needs_madvise
def test_npuw_drops_the_pages_a_cold_store_maps_and_a_warm_store_reads_no_model(
    tiny_dir: Path, store: Store
) -> None:
    """NPUW on CPU keeps its weights in host memory: by default the compile and export
    that fill a cold store leave the .bin's pages to the trimmer; a warm store imports its
    blobs without reading the IR into a model, so the trimmer has no anchor (the host
    embedding lookup maps the .bin for the rows it reads, no more)."""
    npuw = {"NPUW_DEVICES": "CPU", **profile_for("NPU", {"NPUW_DEVICES": "CPU"}).exact_properties}
    prompt = np.random.default_rng(6).integers(3, 2048, 40).tolist()
    small = max(_weights_size(tiny_dir) // 8, 1 << 18)
    tokens = []
    for start in ("cold", "warm"):
        with open_loader(tiny_dir, "64,128", device="NPU", properties=npuw, store=store) as loader:
            assert loader.load_mode is LoadMode.IMPORT
            tokens.append(list(decode(loader, prompt, max_new_tokens=60).token_ids))
            address = loader._compiler.mapped_weights_address()
            if start == "warm":
                assert address is None
                continue
            assert address is not None and _trimming()
            deadline = time.monotonic() + 30.0
            while _resident_bytes_at(address) > small and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _resident_bytes_at(address) <= small
    assert tokens[0] == tokens[1]


@needs_madvise
def test_the_trimmer_is_on_by_default_only_where_this_process_reads_the_ir() -> None:
    from ovspec.compile.split import CoreSplit
    from ovspec.runtime.opening import _trims_weight_pages

    cpu, npuw = profile_for("CPU"), profile_for("NPU", {"NPUW_DEVICES": "CPU"})
    split = CoreSplit((0,), (1,))
    for profile in (cpu, npuw):
        assert _trims_weight_pages(None, profile, LoadMode.COMPILE, None)
        assert _trims_weight_pages(None, profile, LoadMode.IMPORT, None)  # a cold store
        # Under the split a host process builds every blob: this one never reads the IR.
        assert not _trims_weight_pages(None, profile, LoadMode.IMPORT, split)
    assert not _trims_weight_pages(None, cpu, LoadMode.PAGED, None)
    assert not _trims_weight_pages(None, profile_for("NPU"), LoadMode.IMPORT, None)
    assert _trims_weight_pages(True, npuw, LoadMode.IMPORT, split)  # asked for


def _mapped_file_rss_bytes(pid: int, path: Path) -> int:
    """The resident bytes of every mapping of ``path`` in process ``pid`` (smaps)."""
    target, total, inside = os.path.realpath(path), 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = len(head) >= 6 and os.path.realpath(head[5]) == target
            elif inside and head[:1] == ["Rss:"]:
                total += int(head[1]) * 1024
    return total


@needs_madvise
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the split needs 2 cores")
def test_the_split_host_drops_the_pages_of_the_ir_it_compiles_from(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """Under the split the host process reads the IR: its compiles map the .bin in, and
    its trimmer drops those pages; asked not to trim, they stay (the control)."""
    from ovspec.compile.split import CoreSplit

    cores = sorted(os.sched_getaffinity(0))
    split = CoreSplit((cores[0],), (cores[1],))
    bin_path = tiny_dir / "openvino_model.bin"
    size = bin_path.stat().st_size
    small = max(size // 8, 1 << 18)
    resident = {}
    for trim in (False, None):  # None: the profile's default, which trims on the host
        with open_loader(
            tiny_dir,
            "64,128",
            store=tmp_path / f"trim-{trim}",
            properties=EXACT_CPU_PROPERTIES,
            tuning=Tuning(split=split, trim_weight_pages=trim),
        ) as loader:
            decode(loader, [5, 6, 7, 8], max_new_tokens=70)
            host_pid = loader._compiler.delegate.pid  # type: ignore[union-attr]
            assert host_pid is not None and host_pid != os.getpid()
            deadline = time.monotonic() + 30.0  # the trimmer's turn, on a loaded machine
            resident[trim] = _mapped_file_rss_bytes(host_pid, bin_path)
            while trim is None and resident[trim] > small and time.monotonic() < deadline:
                time.sleep(0.05)
                resident[trim] = _mapped_file_rss_bytes(host_pid, bin_path)
    assert resident[False] > size // 2
    assert resident[None] <= small
