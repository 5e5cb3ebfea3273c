"""The dynamic graph of one model, read and prepared once per compiler.

``PreparedModel`` prepares it on first use, or ahead on a thread (``start``) while the
caller does other work: reading the IR and OpenVINO's graph passes release the GIL, so
on a start that compiles from the IR the read overlaps the device probe.
"""

from __future__ import annotations

import threading
import traceback
from concurrent.futures import Future

from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.specialize import DynamicLLM, prepare, read_ir


def prepare_model(model_dir: ModelDir, compression: Compression) -> DynamicLLM:
    """Read, compress and prepare the dynamic graph (raises ``ModelError`` for an IR
    ovspec cannot specialize, e.g. one without a KV cache)."""
    return prepare(compression.apply(read_ir(model_dir.xml_path)))


class PreparedModel:
    """One model's ``DynamicLLM``, prepared at most once (thread-safe)."""

    def __init__(
        self, model_dir: ModelDir, compression: Compression, llm: DynamicLLM | None = None
    ) -> None:
        self.model_dir = model_dir
        self.compression = compression
        self._llm = llm  # prepared by the caller (already validated), else here
        self._ahead: Future[DynamicLLM] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin preparing on a thread (no-op if prepared or started). Its error, if
        any, is raised by ``get``."""
        with self._lock:
            if self._llm is not None or self._ahead is not None:
                return
            ahead: Future[DynamicLLM] = Future()
            thread = threading.Thread(
                target=self._prepare_into, args=(ahead,), name="ovspec-prepare", daemon=True
            )
            thread.start()  # raises (nothing started) where no thread can be made
            self._ahead, self._thread = ahead, thread

    def _prepare_into(self, ahead: Future[DynamicLLM]) -> None:
        ahead.set_running_or_notify_cancel()
        try:
            ahead.set_result(prepare_model(self.model_dir, self.compression))
        except BaseException as exc:  # handed to the caller of get()
            traceback.clear_frames(exc.__traceback__)  # not the half-read model's frames
            ahead.set_exception(exc)

    @property
    def started(self) -> bool:
        """True once preparing has begun (here or ahead) or finished."""
        return self._llm is not None or self._ahead is not None

    def get(self) -> DynamicLLM:
        """The prepared graph: waits for a preparation started ahead, else prepares now."""
        ahead = self._ahead
        if ahead is not None and self._llm is None:
            llm = ahead.result()  # raises the preparation's error, every time it is asked
            with self._lock:
                self._llm = self._llm or llm
        with self._lock:
            if self._llm is None:
                self._llm = prepare_model(self.model_dir, self.compression)
            return self._llm

    def wait_ahead(self) -> DynamicLLM | None:
        """The graph a preparation started ahead made, once it is done; None at once if
        none was started, and None if it failed (``get`` raises its error)."""
        ahead = self._ahead
        if ahead is None:
            return self._llm
        try:
            return ahead.result()
        except BaseException:
            return None

    def peek(self) -> DynamicLLM | None:
        """The prepared graph if someone has had it (``get``), without waiting or
        preparing."""
        return self._llm

    def settle(self) -> None:
        """Wait for a thread started ahead to end (its error is dropped): nothing runs
        on after the compiler that started it is closed or failed to open."""
        if self._thread is not None:
            self._thread.join()
