"""Anonymous mappings: zero-page reads, page moves without copies, pre-faulting, and the
pagemap gauge checked against smaps."""

from __future__ import annotations

import ctypes
import gc
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ovspec.errors import MappingError, RemapUnsupportedError
from ovspec.runtime import vmem

PAGE = vmem.PAGE_BYTES
F32 = np.dtype(np.float32)

pytestmark = pytest.mark.skipif(
    vmem.unsupported_reason() is not None, reason=f"no page mapping: {vmem.unsupported_reason()}"
)


def frames(addr: int, size: int) -> list[int]:
    """Physical frame numbers (0 unless root: the kernel hides them)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        entries = struct.unpack(f"{size // PAGE}Q", f.read(size // PAGE * 8))
    return [e & ((1 << 55) - 1) for e in entries]


def mapped(addr: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= addr < high:
                return True
    return False


def test_reads_commit_nothing_and_writes_commit_pages() -> None:
    region = vmem.Region(64 * PAGE)
    array = region.array(0, [64 * PAGE // 4], F32)
    assert float(array.sum()) == 0.0  # every page read: the zero page
    assert vmem.resident_bytes([region.span]) == 0
    assert vmem.smaps_rss_bytes([region.span]) == 0
    array[:: PAGE // 4 * 8] = 1.0  # one write every 8 pages
    assert vmem.resident_bytes([region.span]) == 8 * PAGE
    assert vmem.smaps_rss_bytes([region.span]) == 8 * PAGE


def test_a_move_keeps_the_pages_and_leaves_the_source_empty() -> None:
    src, dst = vmem.Region(8 * PAGE), vmem.Region(16 * PAGE)
    a = src.array(0, [8 * PAGE // 4], F32)
    a[:] = np.arange(a.size, dtype=np.float32)
    before = frames(src.addr, 8 * PAGE)
    moved = vmem.move_pages([vmem.PageMove(src.addr, dst.addr + 4 * PAGE, 8 * PAGE)])
    assert moved == 8 * PAGE
    b = dst.array(4 * PAGE, [8 * PAGE // 4], F32)
    assert np.array_equal(b, np.arange(b.size, dtype=np.float32))
    assert frames(dst.addr + 4 * PAGE, 8 * PAGE) == before  # same frames (0s unless root)
    assert vmem.resident_bytes([dst.span]) == 8 * PAGE
    assert vmem.resident_bytes([src.span]) == 0
    assert float(a.sum()) == 0.0  # the source stays mapped and reads zeros


@pytest.mark.skipif(os.geteuid() != 0, reason="physical frame numbers need root")
def test_a_move_keeps_the_physical_frames() -> None:
    src, dst = vmem.Region(4 * PAGE), vmem.Region(4 * PAGE)
    src.array(0, [4 * PAGE // 4], F32)[:] = 1.0
    before = frames(src.addr, 4 * PAGE)
    assert all(before)
    vmem.move_pages([vmem.PageMove(src.addr, dst.addr, 4 * PAGE)])
    assert frames(dst.addr, 4 * PAGE) == before


def test_a_refused_move_puts_the_done_ones_back(monkeypatch: pytest.MonkeyPatch) -> None:
    regions = [vmem.Region(2 * PAGE) for _ in range(8)]
    for i, region in enumerate(regions[:4]):
        region.array(0, [2 * PAGE // 4], F32)[:] = i + 1
    libc = vmem._libc()
    real: Callable[[int, int, int, bool], None] = libc.move
    calls = []

    def flaky(src: int, size: int, dst: int, keep_source: bool) -> None:
        calls.append(src)
        if len(calls) == 3:
            raise MappingError("mremap failed: injected")
        real(src, size, dst, keep_source)

    monkeypatch.setattr(libc, "move", flaky)
    moves = [vmem.PageMove(regions[i].addr, regions[i + 4].addr, 2 * PAGE) for i in range(4)]
    with pytest.raises(MappingError, match="injected"):
        vmem.move_pages(moves)
    for i, region in enumerate(regions[:4]):
        assert np.all(region.array(0, [2 * PAGE // 4], F32) == i + 1)
    assert vmem.resident_bytes([r.span for r in regions[4:]]) == 0


@pytest.mark.parametrize("use_memset", [False, True])
def test_populate_write_commits_exactly_the_spans(use_memset: bool) -> None:
    region = vmem.Region(32 * PAGE)
    # Two spans that start and end inside pages: whole pages are committed.
    spans = [(region.addr + 100, 3 * PAGE), (region.addr + 16 * PAGE, PAGE // 2)]
    touched = vmem.populate_write(spans, use_memset=use_memset)
    assert touched == 4 * PAGE + PAGE
    assert vmem.resident_bytes([region.span]) == 5 * PAGE
    assert float(region.array(0, [32 * PAGE // 4], F32).sum()) == 0.0


def test_a_view_keeps_its_region_mapped() -> None:
    region = vmem.Region(PAGE)
    addr = region.addr
    view = region.array(0, [4, 8], F32)[1:3]  # a slice of a view still holds the region
    del region
    gc.collect()
    assert mapped(addr)
    view[:] = 2.0
    assert float(view.sum()) == 2.0 * 16
    del view
    gc.collect()
    assert not mapped(addr)


def test_a_view_must_fit_its_region() -> None:
    region = vmem.Region(PAGE)
    with pytest.raises(ValueError, match="exceeds"):
        region.array(PAGE - 8, [4], F32)


@pytest.mark.parametrize(
    ("sys_platform", "machine", "lib", "message"),
    [
        ("darwin", "arm64", None, "needs Linux"),
        ("win32", "AMD64", None, "needs Linux"),
        ("linux", "mips64", None, "not of mips64"),
        ("linux", "x86_64", object(), "lacks mmap, munmap, mremap, madvise"),
    ],
)
def test_unsupported_platforms_say_why(
    sys_platform: str, machine: str, lib: object, message: str
) -> None:
    with pytest.raises(RemapUnsupportedError, match=message):
        vmem._load(sys_platform, machine, lib)
    assert RemapUnsupportedError.exit_code == 2


@pytest.mark.skipif(vmem.unsupported_reason() is not None, reason="no page mapping here")
def test_page_moves_keep_the_gil() -> None:
    # Through a CDLL each move would drop the GIL and wait up to the switch interval
    # to take it back while another thread runs Python: a boundary's 48 moves cost
    # 13.6 ms instead of 1 with a busy thread beside them (measured).
    mremap = vmem._kernel().libc._mremap
    assert mremap._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def _read_only_file(tmp_path: object, size: int) -> np.memmap:
    path = os.path.join(str(tmp_path), "pages.bin")
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: reads map page-cache pages of zeros
    return np.memmap(path, dtype=np.uint8, mode="r")


def _touch(view: np.ndarray) -> None:
    int(view[::PAGE].sum())  # one read per page maps each in


def test_present_bytes_counts_a_small_file_mapping_exactly(tmp_path: object) -> None:
    pages = 64
    mapping = _read_only_file(tmp_path, pages * PAGE)
    addr = int(mapping.ctypes.data)
    vmem.advise(addr, pages * PAGE, 4)  # MADV_DONTNEED: nothing mapped in
    assert vmem.present_bytes(addr, pages * PAGE) == 0
    _touch(mapping[: 5 * PAGE])  # a file fault maps its neighbours in too (fault-around)
    some = vmem.present_bytes(addr, pages * PAGE)
    assert some == vmem.smaps_rss_bytes([(addr, pages * PAGE)])
    assert some is not None and 5 * PAGE <= some < pages * PAGE
    _touch(mapping)
    assert vmem.present_bytes(addr, pages * PAGE) == pages * PAGE
    assert vmem.present_bytes(addr, 0) == 0


def test_present_bytes_estimates_a_large_mapping_from_samples(tmp_path: object) -> None:
    pages = vmem.EXACT_PRESENCE_PAGES * 2
    size = pages * PAGE
    mapping = _read_only_file(tmp_path, size)
    addr = int(mapping.ctypes.data)
    vmem.advise(addr, size, 4)
    assert vmem.present_bytes(addr, size) == 0
    _touch(mapping[: size // 2])
    half = vmem.present_bytes(addr, size)
    assert half is not None and abs(half - size // 2) <= size // vmem.PRESENCE_SAMPLES
    _touch(mapping)
    assert vmem.present_bytes(addr, size) == size


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping starting at ``addr`` (this process's smaps)."""
    entry = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ")[0] and not line.startswith("VmFlags"):
            entry = int(line.split("-")[0], 16)
        elif line.startswith("VmFlags") and entry == addr:
            return line.split()[1:]
    raise AssertionError(f"no mapping starts at {addr:#x}")


def test_a_region_asks_for_huge_pages_only_when_told() -> None:
    plain, huge = vmem.Region(4 << 20), vmem.Region(4 << 20, huge_pages=True)
    assert "nh" in _vm_flags(plain.addr) and "hg" not in _vm_flags(plain.addr)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    assert ("hg" in _vm_flags(huge.addr)) is thp  # a kernel without THP refuses the hint
    assert "nh" not in _vm_flags(huge.addr)
    plain.release()
    huge.release()
