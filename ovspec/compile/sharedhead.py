"""The LM head one compiler's graphs share (``ir/headcut.py``): compiled once (from the
IR, or built into the store as its own entry and imported), and each cut graph wrapped to
run the head after it, so to a caller it is the uncut graph: inputs and outputs by name,
requests, state.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import openvino as ov

from ovspec.compile.blobfile import FileSink, map_file
from ovspec.compile.modes import LoadMode
from ovspec.errors import CompileError, openvino_message
from ovspec.ir.graph_io import RewriteRefused
from ovspec.ir.headcut import HIDDEN_OUTPUT, head_model
from ovspec.store.local import BlobOutcome, PayloadWriteError, ProducedBlob

if TYPE_CHECKING:
    from ovspec.compile.compiler import Compiler
    from ovspec.compile.halves import CompiledGraph
    from ovspec.compile.programs import Program

# The store metadata's "specialization" of the head's entry (and its key's component).
HEAD_SPECIALIZATION = "lm-head"


def is_cut(compiled: CompiledGraph) -> bool:
    """Whether ``compiled`` ends at the hidden state (its head cut out)."""
    return any(HIDDEN_OUTPUT in port.names for port in compiled.outputs)


class HeadRefused(CompileError):
    """The model's LM head is not a function of the hidden state alone."""


class HeadedCompiledModel:
    """A cut graph and the shared head, run one after the other; what ``Session`` and
    ``warm_up`` use of a compiled model."""

    def __init__(self, body: CompiledGraph, head: ov.CompiledModel) -> None:
        self.body = body
        self.head = head
        # The head's outputs where the hidden state was: the uncut graph's order.
        self._outputs = [
            q for p in body.outputs for q in (head.outputs if HIDDEN_OUTPUT in p.names else [p])
        ]

    @property
    def inputs(self) -> list[Any]:
        return list(self.body.inputs)

    @property
    def outputs(self) -> list[Any]:
        return list(self._outputs)

    def input(self, name: str) -> Any:
        return self.body.input(name)

    def output(self, name: str) -> Any:
        for port in self._outputs:
            if name in port.names:
                return port
        raise RuntimeError(f"the graph has no output {name!r}")

    def create_infer_request(self) -> HeadedInferRequest:
        return HeadedInferRequest(self)


class HeadedInferRequest:
    """Runs the cut graph, then the head on the hidden state it returned."""

    def __init__(self, compiled: HeadedCompiledModel) -> None:
        self._body = compiled.body.create_infer_request()
        self._head = compiled.head.create_infer_request()
        self._head_input = compiled.head.inputs[0]
        self._head_outputs = {n for p in compiled.head.outputs for n in p.names}

    def set_tensor(self, port: str | Any, tensor: ov.Tensor) -> None:
        self._body.set_tensor(port, tensor)

    def get_tensor(self, port: str | Any) -> ov.Tensor:
        name = port if isinstance(port, str) else port.get_any_name()
        if name in self._head_outputs:
            return self._head.get_tensor(name)
        return self._body.get_tensor(port)

    def query_state(self) -> list[Any]:
        return list(self._body.query_state())

    def infer(self) -> None:
        self._body.infer()
        # The body's output tensor may move between calls: bound again, not copied.
        self._head.set_tensor(self._head_input, self._body.get_tensor(HIDDEN_OUTPUT))
        self._head.infer()


class SharedHead:
    """One compiler's head: made on the first cut graph that needs it, then reused. Part
    of the ``Compiler`` (it reads the compiler's Core, lock and compile properties)."""

    def __init__(self, compiler: Compiler) -> None:
        self._compiler = compiler
        self._lock = threading.Lock()
        self._compiled: ov.CompiledModel | None = None
        self._backing: np.ndarray | None = None  # the imported blob's mapping: kept alive
        self.compile_s = 0.0

    def attach(self, program: Program) -> Program:
        """``program`` with its head when its graph was cut; unchanged otherwise."""
        if not is_cut(program.compiled):
            return program
        headed = HeadedCompiledModel(program.compiled, self.get())
        return dataclasses.replace(program, compiled=headed)

    def get(self) -> ov.CompiledModel:
        with self._lock:
            if self._compiled is None:
                if self._compiler.load_mode is LoadMode.IMPORT:
                    self._compiled, self._backing = self._through_store()
                else:
                    self._compiled, self.compile_s = self._compile(self._compiler.properties)
            return self._compiled

    def _compile(self, properties: Mapping[str, Any]) -> tuple[ov.CompiledModel, float]:
        compiler = self._compiler
        llm = compiler.llm()
        try:
            with compiler._llm_lock:  # clones of one model, one at a time
                model = head_model(llm.model, llm.roles)
        except RewriteRefused as exc:
            raise HeadRefused(f"the LM head cannot be compiled apart: {exc}") from exc
        began = time.perf_counter()
        try:
            compiled = compiler._core.compile_model(model, compiler.device, dict(properties))
        except RuntimeError as exc:
            raise CompileError(
                f"{compiler.device} failed to compile the LM head: {openvino_message(exc)}"
            ) from exc
        return compiled, time.perf_counter() - began

    def build(self) -> int | None:
        """Make sure the head's blob is in the store (IMPORT mode); its bytes. None when
        the model's head cannot be cut (its graphs were not cut either: same walk)."""
        try:
            outcome = self._stored(map_payload=False)
        except HeadRefused:
            return None
        outcome.discard()
        return outcome.size_bytes

    def _through_store(self) -> tuple[ov.CompiledModel, np.ndarray]:
        outcome = self._stored(map_payload=True)
        try:
            if not outcome.hit:
                self.compile_s = outcome.compile_s
            mapping = outcome.payload if outcome.payload is not None else map_file(outcome.path)
            return self._compiler._import(mapping, outcome.path.name)
        finally:
            outcome.discard()

    def _stored(self, map_payload: bool) -> BlobOutcome:
        compiler = self._compiler
        key = compiler.head_key()

        def produce(path: Path) -> ProducedBlob:
            assert compiler._compile_properties is not None  # completed by head_key
            compiled, compile_s = self._compile(compiler._compile_properties)
            try:
                with path.open("wb") as f:
                    sink = FileSink(f)
                    compiled.export_model(sink)
                    size = sink.finish()
            except OSError as exc:
                if isinstance(exc, PayloadWriteError):
                    raise
                raise PayloadWriteError(exc.errno or errno.EIO, f"export failed: {exc}") from exc
            metadata = {"specialization": HEAD_SPECIALIZATION, "device": compiler.device}
            return ProducedBlob(compile_s=compile_s, size_bytes=size, metadata=metadata)

        def validate(path: Path) -> None:
            compiler.import_blob(path)

        check = None if compiler.facts.offline else validate
        return compiler.store.get_or_create(key, produce, validate=check, map_payload=map_payload)
