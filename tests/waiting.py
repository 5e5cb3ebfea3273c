"""Waiting in tests for what another thread or process does: poll a condition until a
deadline, never sleep a fixed time and hope (a loaded CI machine may take a while)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``condition`` every 5 ms; fail naming ``what`` once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
