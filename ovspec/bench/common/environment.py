"""Where and how a benchmark ran: the host, its load, the commit, and the process's
own resources (peak RSS, CPU seconds), plus page-cache control for cold reads.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from ovspec.bench.common.records import Environment
from ovspec.compile.host import cpu_model


def git_commit() -> str:
    repo = Path(__file__).resolve().parents[3]  # ovspec/bench/common/ -> the checkout
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # docs/ is not code: a page another benchmark just wrote does not dirty this run.
            [
                "git",
                "-C",
                str(repo),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)docs",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' (dirty)' if dirty else ''}"


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def environment(load_start: tuple[float, float, float]) -> Environment:
    import openvino as ov

    from ovspec.version import __version__

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return Environment(
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        cpu_model=cpu_model(),
        logical_cores=os.cpu_count() or 0,
        usable_cores=usable,
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        os=platform.platform(),
        python=platform.python_version(),
        openvino=str(ov.get_version()),
        ovspec=__version__,
        git_commit=git_commit(),
        load_average_start=load_start,
        load_average_end=load_average(),
    )


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except FileNotFoundError:
                continue  # a lock or temp vanished while walking
    return total


def drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to forget a file's cached pages (best effort, no root needed)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True
