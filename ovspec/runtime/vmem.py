"""Virtual memory for KV buffers: anonymous private mappings (a page is committed by its
first write; a read before that maps the kernel's shared zero page), page moves with
``mremap`` (page-table entries change address, no byte is copied), write pre-faulting,
and what an address range really holds (``/proc/self/pagemap``, not ``mincore``).

Linux only, libc through ctypes (Python's ``mmap`` has neither ``MAP_FIXED`` nor
``mremap``). ``unsupported_reason()`` says why a platform cannot run it; callers fail
over to plain numpy buffers then. No OpenVINO here: addresses, sizes and numpy views.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import platform
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ovspec.errors import MappingError, RemapUnsupportedError

# Linux's generic ABI values (x86_64, aarch64, riscv64). mips, sparc, alpha, parisc and
# powerpc spell some of these differently, so they are refused, not guessed.
_PROT_READ_WRITE = 0x1 | 0x2
_MAP_PRIVATE = 0x02
_MAP_ANONYMOUS = 0x20
_MAP_NORESERVE = 0x4000
_MREMAP_MAYMOVE = 1
_MREMAP_FIXED = 2
_MREMAP_DONTUNMAP = 4  # Linux >= 5.7
_MOVE = _MREMAP_MAYMOVE | _MREMAP_FIXED
_MOVE_KEEPING_SOURCE = _MOVE | _MREMAP_DONTUNMAP
_MADV_HUGEPAGE = 14
_MADV_NOHUGEPAGE = 15
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_GENERIC_ABI_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64", "riscv64"})
_MAP_FAILED = ctypes.c_void_p(-1).value

# /proc/self/pagemap entries (Documentation/admin-guide/mm/pagemap.rst): a page counts
# as committed when it is present and mapped exclusively (the shared zero page never
# is), or swapped out. Readable without privileges (only the frame numbers need root).
_PM_PRESENT = np.uint64(1 << 63)
_PM_SWAPPED = np.uint64(1 << 62)
_PM_EXCLUSIVE = np.uint64(1 << 56)

PAGE_BYTES = mmap.PAGESIZE


class _Libc:
    """The libc calls the KV layouts need, bound once and checked by a probe.

    ``mremap`` is bound through ``gil_lib`` (a ``ctypes.PyDLL``: the call keeps the GIL).
    A boundary makes one short call per head block; through a ``CDLL`` each would drop
    the GIL and wait to take it back, up to the switch interval (5 ms) whenever another
    thread runs Python (a loader preparing the next rung), which made an in-process
    boundary 4-13 ms instead of ~1.
    """

    def __init__(self, lib: Any, gil_lib: Any | None = None) -> None:
        missing = [n for n in ("mmap", "munmap", "mremap", "madvise") if not hasattr(lib, n)]
        if missing:
            raise RemapUnsupportedError(f"the C library lacks {', '.join(missing)}")
        vp, size = ctypes.c_void_p, ctypes.c_size_t
        gil_lib = lib if gil_lib is None else gil_lib
        self._mremap = gil_lib.mremap
        self._mremap.restype = vp
        self._mremap.argtypes = [vp, size, size, ctypes.c_int, vp]
        lib.mmap.restype = vp
        lib.mmap.argtypes = [vp, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [vp, size]
        lib.madvise.restype = ctypes.c_int
        lib.madvise.argtypes = [vp, size, ctypes.c_int]
        self._lib = lib

    def map(self, size_bytes: int) -> int:
        # NORESERVE: address space is not committed memory; pages come with first writes.
        flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE
        got = self._lib.mmap(None, size_bytes, _PROT_READ_WRITE, flags, -1, 0)
        if got is None or got == _MAP_FAILED:
            raise _errno_error(f"mmap of {size_bytes} bytes")
        return int(got)

    def unmap(self, addr: int, size_bytes: int) -> None:
        if self._lib.munmap(addr, size_bytes) != 0:
            raise _errno_error(f"munmap of {size_bytes} bytes at {addr:#x}")

    def move(self, src: int, size_bytes: int, dst: int, keep_source: bool) -> None:
        """Move the pages of [src, src+size) to dst, replacing what was mapped there.

        ``keep_source`` (MREMAP_DONTUNMAP) leaves the source range mapped and empty:
        it stays ours, so nothing else can be mapped into it before we are done.
        """
        flags = _MOVE_KEEPING_SOURCE if keep_source else _MOVE
        if self._mremap(src, size_bytes, size_bytes, flags, dst) != dst:  # MAP_FAILED, None
            raise _errno_error(f"mremap of {size_bytes} bytes {src:#x} -> {dst:#x}")

    def advise(self, addr: int, size_bytes: int, advice: int) -> None:
        if self._lib.madvise(addr, size_bytes, advice) != 0:
            raise _errno_error(f"madvise({advice}) of {size_bytes} bytes at {addr:#x}")

    def probe(self, advice: int | None = None) -> bool:
        """Whether a one-page DONTUNMAP move (or ``advice``) works on this kernel."""
        src = self.map(PAGE_BYTES)
        dst = self.map(PAGE_BYTES)
        try:
            if advice is None:
                self.move(src, PAGE_BYTES, dst, keep_source=True)
            else:
                self.advise(src, PAGE_BYTES, advice)
            return True
        except MappingError:
            return False
        finally:
            self.unmap(src, PAGE_BYTES)
            self.unmap(dst, PAGE_BYTES)


def _errno_error(what: str) -> MappingError:
    err = ctypes.get_errno()
    return MappingError(f"{what} failed: {os.strerror(err)} (errno {err})")


@dataclass(frozen=True)
class _Kernel:
    libc: _Libc
    populate_write: bool  # MADV_POPULATE_WRITE (Linux >= 5.14); else memset pre-faults


def _load(sys_platform: str, machine: str, lib: Any | None, gil_lib: Any | None = None) -> _Kernel:
    if not sys_platform.startswith("linux"):
        raise RemapUnsupportedError(f"it needs Linux (mremap); this is {sys_platform}")
    if machine.lower() not in _GENERIC_ABI_MACHINES:
        raise RemapUnsupportedError(
            f"it knows the mmap flag values of {', '.join(sorted(_GENERIC_ABI_MACHINES))}, "
            f"not of {machine}"
        )
    if lib is None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        lib = ctypes.CDLL(name, use_errno=True)
        gil_lib = ctypes.PyDLL(name, use_errno=True)
    libc = _Libc(lib, gil_lib)
    if not libc.probe():
        raise RemapUnsupportedError("this kernel lacks mremap(MREMAP_DONTUNMAP) (Linux >= 5.7)")
    return _Kernel(libc, populate_write=libc.probe(_MADV_POPULATE_WRITE))


@functools.cache
def _kernel() -> _Kernel:
    return _load(sys.platform, platform.machine(), None)


def unsupported_reason() -> str | None:
    """None when this process can map and move pages; else why not, as one clause."""
    try:
        _kernel()
    except RemapUnsupportedError as exc:
        return str(exc)
    except OSError as exc:  # no loadable C library
        return f"the C library cannot be loaded ({exc})"
    return None


def _libc() -> _Libc:
    reason = unsupported_reason()
    if reason is not None:
        raise RemapUnsupportedError(f"page mapping is unavailable here: {reason}")
    return _kernel().libc


def advise(addr: int, size_bytes: int, advice: int) -> None:
    """``madvise(addr, size_bytes, advice)``; raises ``MappingError`` with the errno."""
    _libc().advise(addr, size_bytes, advice)


def populate_write_supported() -> bool:
    """Whether pre-faulting runs in the kernel (MADV_POPULATE_WRITE) rather than memset."""
    return unsupported_reason() is None and _kernel().populate_write


def round_up_to_pages(size_bytes: int) -> int:
    return -(-size_bytes // PAGE_BYTES) * PAGE_BYTES


class Region:
    """One anonymous private mapping [addr, addr + size_bytes), unmapped when the last
    holder goes: the region itself, or any numpy view made by ``array`` (a view keeps
    the mapping alive, so no Python view can outlive its memory).

    Huge pages are off (``MADV_NOHUGEPAGE``): one would commit 2 MiB on its first write
    on a THP-``always`` system, and moving a block smaller than one would split it. With
    ``huge_pages`` (a region only ever grown, never moved) they are asked for instead,
    where the kernel has them: fewer TLB misses for a reader sweeping the whole range.
    """

    def __init__(self, size_bytes: int, huge_pages: bool = False) -> None:
        libc = _libc()
        self.size_bytes = round_up_to_pages(max(size_bytes, 1))
        self.addr = libc.map(self.size_bytes)
        self._owner = _Owner(libc, self.addr, self.size_bytes)
        if not huge_pages:
            libc.advise(self.addr, self.size_bytes, _MADV_NOHUGEPAGE)
        else:
            with contextlib.suppress(MappingError):  # a hint: a kernel without THP refuses
                libc.advise(self.addr, self.size_bytes, _MADV_HUGEPAGE)
        # One base array over the whole mapping; a view of it costs less than a fresh
        # array interface (a boundary makes one per past tensor).
        self._bytes: np.ndarray = np.asarray(_View(self._owner))

    def array(self, offset_bytes: int, shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
        """A dense writable C-order view of ``shape`` at ``offset_bytes`` into the region."""
        nbytes = math.prod(shape) * dtype.itemsize
        if offset_bytes < 0 or offset_bytes + nbytes > self.size_bytes:
            raise ValueError(
                f"a {nbytes}-byte view at {offset_bytes} exceeds the {self.size_bytes}-byte region"
            )
        view: np.ndarray = np.ndarray(tuple(shape), dtype, buffer=self._bytes, offset=offset_bytes)
        return view

    @property
    def span(self) -> tuple[int, int]:
        return self.addr, self.size_bytes

    def release(self) -> None:
        """Unmap now. Only for a region no view or infer request points into any more."""
        self._owner.finalizer()


class _Owner:
    """Owns the mapping: unmaps it when collected. Held by the region and by every
    array's base, never the other way round, so refcounting frees it promptly."""

    def __init__(self, libc: _Libc, addr: int, size_bytes: int) -> None:
        self.addr, self.size_bytes = addr, size_bytes
        self.finalizer = weakref.finalize(self, _unmap_quietly, libc, addr, size_bytes)


def _unmap_quietly(libc: _Libc, addr: int, size_bytes: int) -> None:
    # A finalizer must not raise; munmap of a range we own only fails on a bad argument.
    with contextlib.suppress(MappingError):
        libc.unmap(addr, size_bytes)


class _View:
    """Hands numpy the mapping through ``__array_interface__``; numpy keeps this object
    as the array's base, so every view of the array keeps the mapping alive."""

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "shape": (owner.size_bytes,),
            "typestr": "|u1",
            "data": (owner.addr, False),
            "version": 3,
        }


class PageMove(NamedTuple):
    """Pages [src, src + size_bytes) go to dst (all page-aligned)."""

    src: int
    dst: int
    size_bytes: int


def move_pages(moves: Sequence[PageMove]) -> int:
    """Move every range, or none: a refusal half-way moves the done ones back.

    The sources stay mapped (empty) afterwards: reading them gives zeros, so a stale
    view reads zeros rather than memory some later mapping reused. Returns the bytes
    moved (whole pages; only pages a process wrote hold memory).
    """
    libc = _libc()
    done: list[PageMove] = []
    try:
        for move in moves:
            if move.size_bytes:
                libc.move(move.src, move.size_bytes, move.dst, keep_source=True)
                done.append(move)
    except MappingError:
        for move in reversed(done):
            libc.move(move.dst, move.size_bytes, move.src, keep_source=True)
        raise
    return sum(m.size_bytes for m in done)


def populate_write(spans: Sequence[tuple[int, int]], use_memset: bool = False) -> int:
    """Commit the pages of each (addr, size) span now, as a first write would (zeros).

    ``MADV_POPULATE_WRITE`` where the kernel has it (one call per span, in the kernel),
    else ``memset`` of zeros (any platform). Both run without the GIL (ctypes releases
    it), so a thread can do this beside a decode. Returns the bytes of the pages touched.
    """
    in_kernel = populate_write_supported() and not use_memset
    libc = _libc() if in_kernel else None
    total = 0
    for addr, size in spans:
        if size <= 0:
            continue
        low = addr // PAGE_BYTES * PAGE_BYTES
        high = round_up_to_pages(addr + size)
        if libc is not None:
            libc.advise(low, high - low, _MADV_POPULATE_WRITE)
        else:
            ctypes.memset(addr, 0, size)
        total += high - low
    return total


def resident_bytes(spans: Sequence[tuple[int, int]]) -> int | None:
    """Bytes committed in the (addr, size) spans: pages present and not shared (the
    zero page is shared), or swapped; whole pages. None where pagemap is unreadable.

    ``mincore`` would be wrong here: it reports zero-page mappings as resident.
    """
    if not sys.platform.startswith("linux"):
        return None
    total = 0
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            for addr, size in spans:
                if size <= 0:
                    continue
                first, count = _pages(addr, size)
                entries = _pagemap_entries(f.fileno(), first, count)
                present = (entries & _PM_PRESENT) != 0
                exclusive = (entries & _PM_EXCLUSIVE) != 0
                swapped = (entries & _PM_SWAPPED) != 0
                total += int(np.count_nonzero((present & exclusive) | swapped)) * PAGE_BYTES
    except OSError:
        return None
    return total


EXACT_PRESENCE_PAGES = 8192  # up to here every entry is read (64 KiB of pagemap)
PRESENCE_SAMPLES = 64  # pages read, evenly spaced, in a larger span


def present_bytes(addr: int, size_bytes: int) -> int | None:
    """Bytes of the span whose pages are mapped in now (present in this process's page
    table: a file page counts once faulted in, and no more after ``MADV_DONTNEED``).

    Exact up to ``EXACT_PRESENCE_PAGES`` pages; a larger span is estimated from
    ``PRESENCE_SAMPLES`` evenly spaced pages (~0.2 ms). None where pagemap is unreadable.
    """
    if not sys.platform.startswith("linux"):
        return None
    if size_bytes <= 0:
        return 0
    first, pages = _pages(addr, size_bytes)
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            if pages <= EXACT_PRESENCE_PAGES:
                entries = _pagemap_entries(f.fileno(), first, pages)
                return int(np.count_nonzero(entries & _PM_PRESENT)) * PAGE_BYTES
            picks = np.linspace(first, first + pages - 1, PRESENCE_SAMPLES).astype(np.int64)
            found = sum(
                1 for page in picks if _pagemap_entries(f.fileno(), int(page), 1)[0] & _PM_PRESENT
            )
    except OSError:
        return None
    return found * size_bytes // PRESENCE_SAMPLES


def _pages(addr: int, size_bytes: int) -> tuple[int, int]:
    """The first page of the span and its number of pages (whole pages it touches)."""
    first = addr // PAGE_BYTES
    return first, round_up_to_pages(addr + size_bytes) // PAGE_BYTES - first


def _pagemap_entries(fd: int, first_page: int, pages: int) -> np.ndarray:
    """``pages`` pagemap entries from ``first_page`` on, read from ``fd``."""
    return np.frombuffer(os.pread(fd, pages * 8, first_page * 8), np.uint64)


def smaps_rss_bytes(spans: Sequence[tuple[int, int]]) -> int:
    """Rss of the mappings lying inside the spans, from /proc/self/smaps: a second,
    coarser gauge (whole mappings) to check ``resident_bytes`` against in tests."""
    merged: list[list[int]] = []
    for addr, size in sorted(spans):
        if merged and addr <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], addr + size)
        else:
            merged.append([addr, addr + size])
    total = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = any(a <= low and high <= b for a, b in merged)
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total
