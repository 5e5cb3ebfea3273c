"""Keeps the IR's mapped weights file out of this process's resident set (CPU, NPUW on CPU).

OpenVINO maps the IR's ``.bin``. A CPU graph packs the weights it uses into private
memory (at its compile, and the rest at its first inference) and does not read the
mapping again: on the 0.5B preset no page of it came back in 20 decode steps. The pages
the packing touched stay mapped, ~1 GiB of RSS that nothing reads. ``WeightPageTrimmer``
drops them (``MADV_DONTNEED`` on a read-only file mapping: a later read faults the page
back in from the page cache) whenever a step's worth of them is mapped in again.
Before that, ``WeightPrefault`` maps the file's pages in on a spare core while the first
graph compiles, so that its packing does not take the page faults on the critical path.
Under the split the host build process reads the IR: ``serve_host_builds_trimmed``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovspec.compile.split import serve_builds
from ovspec.errors import MappingError
from ovspec.runtime import vmem

if TYPE_CHECKING:
    from ovspec.compile.compiler import Compiler

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # Linux, every ABI
MADV_POPULATE_READ = 22  # Linux >= 5.14, every ABI
MAX_STEP_MIB = 16.0
MIN_STEP_MIB = 0.25


@dataclass(frozen=True)
class MappedRange:
    """One line of ``/proc/PID/maps``."""

    address: int
    size_bytes: int
    writable: bool
    path: str  # "" for an anonymous mapping


def mapping_at(address: int, maps_text: str) -> MappedRange | None:
    """The mapping holding ``address`` in ``maps_text`` (the format of ``/proc/PID/maps``;
    a path may hold spaces: it is the line's whole tail)."""
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            path = fields[5] if len(fields) == 6 else ""
            return MappedRange(low, high - low, "w" in fields[1], path)
    return None


def file_rss_mib() -> float:
    """This process's file-backed resident memory (``RssFile``), MiB; 0 where unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def weights_mapping(weights_path: str, address: int) -> MappedRange | None:
    """The read-only mapping of ``weights_path`` (a real path) holding ``address``, or
    None (e.g. a weight compression rewrote the weights into private memory)."""
    with open("/proc/self/maps") as f:
        found = mapping_at(address, f.read())
    if found is None or found.writable or found.path != weights_path:
        return None
    return found


class WeightPrefault(threading.Thread):
    """Maps the pages of the weights file's mapping in ahead of the first graph's
    packing (``MADV_POPULATE_READ``: page-table entries for pages in the page cache, a
    read from disk for the others), once ``address()`` has returned the address of one
    weight in it (it may wait for the IR to be read; None: nothing to do).

    It takes the packing's page faults off the first prompt's critical path (its
    measurements are in docs/DESIGN.md). Best effort: a kernel without the advice
    (< 5.14) or a missing mapping is a no-op, logged at debug level.
    """

    CHUNK_BYTES = 64 << 20  # advised at a time: ``stop`` waits for one chunk at most

    def __init__(self, weights_path: Path, address: Callable[[], int | None]) -> None:
        super().__init__(name="ovspec-weight-prefault", daemon=True)
        self.weights_path = os.path.realpath(weights_path)
        self.address = address
        self.populated_bytes = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            address = self.address()
            found = None if address is None else weights_mapping(self.weights_path, address)
            if found is None:
                return
            end = found.address + found.size_bytes
            for start in range(found.address, end, self.CHUNK_BYTES):
                if self._stopping.is_set():  # closing: the pages can fault in as needed
                    return
                size = min(self.CHUNK_BYTES, end - start)
                vmem.advise(start, size, MADV_POPULATE_READ)
                self.populated_bytes += size
        except Exception as exc:  # best effort: the packing faults the pages in itself
            log.debug("did not prefault the weights' pages: %s", exc)

    def stop(self) -> None:
        """Stop after the chunk under way and wait (the mapping must outlive the advice:
        its compiler closes next). A chunk of a file not in the page cache is a read."""
        self._stopping.set()
        if self.is_alive():
            self.join()


class WeightPageTrimmer(threading.Thread):
    """Drops the pages of the mapping of ``weights_path`` that holds ``anchor()`` (the
    address of one weight the caller keeps alive until ``stop``: so that mapping cannot
    be unmapped, nor its address reused, while this thread advises it) every time
    ``step_mib`` of them are mapped in again. The mapping must be read-only: dropping a
    written private page would lose the write.

    It counts the mapping's own pages (``vmem.present_bytes``, from the page table)
    whenever the process's ``RssFile`` moved since the last poll (every ``poll_s``: a read
    of ``/proc/self/status``, ~0.1 ms), and every ``check_s`` regardless: ``RssFile`` is
    the whole process's, and another mapping going away (another loader's, or a freed
    model's) can cancel this one's growth out exactly. Where pagemap is unreadable it
    falls back to ``RssFile`` growing by ``step_mib`` over its lowest reading since the
    last drop.

    While a graph packs its weights the file pages come and go ``step_mib`` at a time;
    while it decodes nothing grows and nothing is dropped. Only this loader's mapping is
    advised, never another mapping of the same file (another loader may unmap its own).
    """

    def __init__(
        self,
        weights_path: Path,
        anchor: Callable[[], int | None],
        poll_s: float = 0.05,
        step_mib: float = MAX_STEP_MIB,
        check_s: float = 1.0,
    ) -> None:
        super().__init__(name="ovspec-weight-pages", daemon=True)
        self.weights_path = os.path.realpath(weights_path)
        self.anchor = anchor
        self.poll_s = poll_s
        self.step_mib = step_mib
        self.check_s = check_s
        self.drops = 0
        self._done = threading.Event()
        self._baseline_mib = file_rss_mib()
        self._last_mib = self._baseline_mib
        self._checked_s = time.monotonic()
        self._advised: MappedRange | None = None  # the mapping of the last drop
        self._pagemap = True  # False once pagemap proved unreadable: RssFile alone

    @classmethod
    def for_weights(cls, weights_path: Path, anchor: Callable[[], int | None]) -> WeightPageTrimmer:
        """A trimmer dropping at an eighth of the file (16 MiB at most, 0.25 at least):
        a small model's file is trimmed too."""
        eighth_mib = weights_path.stat().st_size / 8 / 2**20
        return cls(weights_path, anchor, step_mib=min(MAX_STEP_MIB, max(eighth_mib, MIN_STEP_MIB)))

    @staticmethod
    def unsupported_reason() -> str | None:
        """None where pages can be dropped here; else why not, as one clause."""
        return vmem.unsupported_reason()

    def drop(self) -> int:
        """Drop the mapping's pages now; returns the bytes advised (0 when the anchor is not
        set yet, or lies outside a read-only mapping of the weights file: e.g. a weight
        compression rewrote into private memory)."""
        address = self.anchor()
        found = None if address is None else weights_mapping(self.weights_path, address)
        if found is None:
            return 0
        vmem.advise(found.address, found.size_bytes, MADV_DONTNEED)
        self._advised = found
        self.drops += 1
        return found.size_bytes

    def run(self) -> None:
        # Started once the graphs have packed what they need: drop at once, then on
        # growth. Growth since the reading at construction alone could be hidden (RssFile
        # is the whole process's: another loader may unmap its own mapping meanwhile).
        if self._done.is_set() or not self._drop_or_stop():
            return
        while not self._done.wait(self.poll_s):
            if self._grown() and not self._drop_or_stop():
                return

    def _grown(self) -> bool:
        """Whether a step's worth of the mapping is back (see the class docstring)."""
        now_mib = file_rss_mib()
        moved, self._last_mib = now_mib != self._last_mib, now_mib
        self._baseline_mib = min(self._baseline_mib, now_mib)
        advised = self._advised
        if self._pagemap and advised is not None:
            if not moved and time.monotonic() - self._checked_s < self.check_s:
                return False
            self._checked_s = time.monotonic()
            present = vmem.present_bytes(advised.address, advised.size_bytes)
            if present is not None:
                return present >= self.step_mib * 2**20
            self._pagemap = False
        return now_mib >= self._baseline_mib + self.step_mib

    def _drop_or_stop(self) -> bool:
        try:
            self.drop()
        except (OSError, MappingError) as exc:
            log.warning("stopped dropping the weights' pages: %s", exc)
            return False
        self._baseline_mib = file_rss_mib()
        return True

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


def serve_host_builds_trimmed(config: Any, requests: Any, replies: Any) -> None:
    """The split's host build process (``compile/split.py``), dropping the IR's weight
    pages as its compiles read them: a compile reads every weight, then its export
    evaluates them into private memory, and the file's pages would stay resident."""
    serve_builds(config, requests, replies, around_builds=_trimming)


@contextlib.contextmanager
def _trimming(compiler: Compiler) -> Iterator[None]:
    trimmer = WeightPageTrimmer.for_weights(
        compiler.model_dir.bin_path, compiler.mapped_weights_address
    )
    trimmer.start()  # nothing mapped yet: it drops once the first compile maps a step
    try:
        yield
    finally:
        trimmer.stop()
