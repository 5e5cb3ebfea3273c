"""Keeps the IR's mapped weights file out of this process's resident set (CPU).

OpenVINO maps the IR's ``.bin``. A CPU graph packs the weights it uses into private
memory (at its compile, and the rest at its first inference) and does not read the
mapping again: on the 0.5B preset no page of it came back in 20 decode steps. The pages
the packing touched stay mapped, ~1 GiB of RSS that nothing reads. ``WeightPageTrimmer``
drops them (``MADV_DONTNEED`` on a read-only file mapping: a later read faults the page
back in from the page cache) whenever the file-backed RSS has grown since its last drop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from ovspec.errors import MappingError
from ovspec.runtime import vmem

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # Linux, every ABI


def read_only_mappings(path: Path, maps_text: str) -> list[tuple[int, int]]:
    """(address, bytes) of each mapping of ``path`` in ``maps_text`` (the format of
    ``/proc/PID/maps``) that no one can write through: dropping the pages of a written
    private mapping would lose the writes, so those are never returned."""
    wanted = os.path.realpath(path)
    spans = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5] != wanted or "w" in fields[1]:
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        spans.append((low, high - low))
    return spans


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


class WeightPageTrimmer(threading.Thread):
    """Drops the pages of ``paths``' read-only mappings from this process's resident set
    every time ``RssFile`` has grown by ``step_mib`` since the last drop (polled every
    ``poll_s``: a read of ``/proc/self/status``, ~0.1 ms). While a graph packs its weights
    the file pages come and go ``step_mib`` at a time; while it decodes nothing grows and
    nothing is dropped."""

    def __init__(self, paths: Sequence[Path], poll_s: float = 0.05, step_mib: float = 16.0):
        super().__init__(name="ovspec-weight-pages", daemon=True)
        self.paths = [Path(p) for p in paths]
        self.poll_s = poll_s
        self.step_mib = step_mib
        self.drops = 0
        self.dropped_bytes = 0  # the mappings' sizes advised, not pages that were resident
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._baseline_mib = file_rss_mib()

    @classmethod
    def for_file(cls, path: Path) -> WeightPageTrimmer:
        """A trimmer for one weights file, dropping at an eighth of its size (at most
        16 MiB): a small model's file is trimmed too."""
        step_mib = min(16.0, path.stat().st_size / 8 / 2**20)
        return cls([path], step_mib=step_mib)

    @staticmethod
    def unsupported_reason() -> str | None:
        """None where pages can be dropped here; else why not, as one clause."""
        return vmem.unsupported_reason()

    def drop(self) -> int:
        """Drop the mapped pages now; returns the bytes of mapping advised."""
        with open("/proc/self/maps") as f:
            maps_text = f.read()
        spans = [s for p in self.paths for s in read_only_mappings(p, maps_text)]
        with self._lock:
            for addr, size in spans:
                vmem.advise(addr, size, MADV_DONTNEED)
            self.drops += 1
            self.dropped_bytes += sum(size for _, size in spans)
            self._baseline_mib = file_rss_mib()
        return sum(size for _, size in spans)

    def run(self) -> None:
        while not self._done.wait(self.poll_s):
            if file_rss_mib() >= self._baseline_mib + self.step_mib:
                try:
                    self.drop()
                except (OSError, MappingError) as exc:
                    log.warning("stopped dropping the weights' pages: %s", exc)
                    return

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()
