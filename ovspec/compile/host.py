"""What machine a measurement ran on, from the standard library only.

Benchmarks and trial workers print it next to their figures; the compile worker
imports it inside an arm's interpreter, so it must not need anything but Python.
"""

from __future__ import annotations

import platform
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
