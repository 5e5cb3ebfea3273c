"""The loader's background worker: one thread at a lowered priority (on given cores, for
the device/host split), the warm-up it gives each graph it loads, and closing it without
waiting for a build in flight, which then finishes alone; whether such a build is still
running when a process is about to exit.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import openvino as ov

from ovspec.compile.halves import CompiledGraph

# The worker's thread names start with this.
WORKER_THREAD_PREFIX = "ovspec-loader"
T = TypeVar("T")


class Worker:
    """Background threads running loads (one by default: in order)."""

    def __init__(self, cores: tuple[int, ...] | None = None, lanes: int = 1) -> None:
        self.lanes = lanes
        self._pool = ThreadPoolExecutor(
            max_workers=lanes,
            thread_name_prefix=WORKER_THREAD_PREFIX,
            initializer=_prepare_thread,
            initargs=(cores,),
        )

    def submit(self, work: Callable[..., T], *args: Any) -> Future[T]:
        return self._pool.submit(work, *args)

    def close(self, running: Sequence[Future[Any]], wait: bool, then: Callable[[], None]) -> None:
        """Take no more work (queued work is cancelled) and call ``then`` once nothing
        runs: here, after waiting for ``running`` (``wait``) or when none runs; else on
        the worker, when the last of ``running`` ends (a compile cannot be stopped)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if wait or not running:
            then()
            return
        left = len(running)
        lock = threading.Lock()

        def one_done(_: Future[Any]) -> None:
            nonlocal left
            with lock:
                left -= 1
                last = left == 0
            if last:
                then()

        for future in running:
            future.add_done_callback(one_done)


def builds_left_running() -> bool:
    """Whether a closed loader's worker is still finishing a build nobody waits for (see
    ``Loader.close``): a process about to exit need not wait for it."""
    return any(
        t.name.startswith(WORKER_THREAD_PREFIX) and t.is_alive() for t in threading.enumerate()
    )


def _prepare_thread(cores: tuple[int, ...] | None) -> None:
    if cores is not None:
        os.sched_setaffinity(0, cores)  # Linux: this thread only
    _lower_priority()


def _lower_priority() -> None:
    """Let the decode thread win the cores from background compiles (per-thread nice)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def warm_up(compiled: CompiledGraph) -> float:
    """Run one throwaway inference; returns its seconds.

    A compiled model's first inference pays one-time costs (CPU: allocations and
    weight repacking, 10-30 ms on a small model). Paying them here, on the loader's
    thread, keeps them out of the first decode step after a boundary.
    """
    began = time.perf_counter()
    request = compiled.create_infer_request()
    for port in compiled.inputs:
        # A graph taking 1..P tokens is warmed with one: a decode-shaped call.
        dims = [d.get_min_length() if d.is_dynamic else d.get_length() for d in port.partial_shape]
        request.set_tensor(port, ov.Tensor(np.zeros(dims, dtype=port.element_type.to_dtype())))
    request.infer()
    return time.perf_counter() - began
