"""What machine a measurement ran on, and how a background thread yields it, from the
standard library only.

Benchmarks and trial workers print it next to their figures; the compile worker
imports it inside an arm's interpreter, so it must not need anything but Python.
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
from pathlib import Path


def cpu_model() -> str:
    """The processor's marketing name (``/proc/cpuinfo``), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def lower_thread_priority() -> None:
    """Let the decode thread win the cores from this background thread (Linux:
    per-thread nice 10). Best effort: a platform without per-thread priorities keeps
    the default."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
