"""A full disk, for the suite's store tests and the fault campaign (``bench/faults``):
both fill a small tmpfs the same way before they watch what the store does."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fill_disk(folder: Path, leave_bytes: int = 0) -> None:
    """Fill the filesystem of ``folder`` (a file named ``filler``) until at most
    ``leave_bytes`` are free."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize - leave_bytes
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
        while free > 0:
            n = min(free, 1 << 16)
            f.write(b"\0" * n)
            free -= n
        f.flush()
