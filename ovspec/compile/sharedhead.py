"""The LM head and the embeddings one compiler's graphs share (``ir/headcut.py``): each
compiled once (from the IR, or built into the store as an entry of its own and imported),
and each cut graph wrapped to run them around it, so to a caller it is the uncut graph:
inputs and outputs by name, requests, state. An embedding that only copies table rows is
a ``HostLookup`` over the weights' mapping instead of a model.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovspec.compile.blobfile import FileSink, map_file, throwaway_cache
from ovspec.compile.halves import ComposedModel
from ovspec.compile.modes import LoadMode
from ovspec.errors import CompileError, openvino_message
from ovspec.ir.compression import CompressionMode
from ovspec.ir.graph_io import RewriteRefused
from ovspec.ir.headcut import (
    EMBEDS_INPUT,
    HIDDEN_OUTPUT,
    HostTable,
    embedding_model,
    head_model,
    host_table,
)
from ovspec.ir.specialize import read_ir
from ovspec.store.local import BlobOutcome, PayloadWriteError, ProducedBlob

if TYPE_CHECKING:
    from ovspec.compile.compiler import Compiler
    from ovspec.compile.halves import CompiledGraph
    from ovspec.compile.programs import Program

# The store metadata's "specialization" of the head's entry (and its key's component);
# an embedding model's is EMBEDDING_PREFIX + its chunk.
HEAD_SPECIALIZATION = "lm-head"
EMBEDDING_PREFIX = "embedding:"


def is_cut(compiled: CompiledGraph) -> bool:
    """Whether ``compiled`` ends at the hidden state (its head cut out)."""
    return any(HIDDEN_OUTPUT in port.names for port in compiled.outputs)


def embedding_chunk(compiled: CompiledGraph) -> int | None:
    """The chunk of the embeddings ``compiled`` takes in place of its lookup, if it does."""
    port = next((p for p in compiled.inputs if EMBEDS_INPUT in p.names), None)
    return None if port is None else int(port.get_partial_shape()[1].get_length())


class PartRefused(CompileError):
    """The model's LM head or embedding is not a function of its one input alone."""


def _names(port: str | Any) -> set[str]:
    return {port} if isinstance(port, str) else set(port.names)


class HostLookup:
    """One chunk's embedding lookup done on the host: the rows of the token ids, copied out
    of the table and widened as the graph's Convert does (bit for bit). Shows the compiled
    lookup model's face: its ids input by name, requests, one output."""

    def __init__(self, table: HostTable, chunk_tokens: int) -> None:
        self.table, self.chunk_tokens = table, chunk_tokens
        ids = ops.parameter([1, chunk_tokens], table.ids_type)
        ids.output(0).get_tensor().set_names(set(table.ids_names))
        self._ids = ids  # owns the port
        self.inputs = [ids.output(0)]

    def create_infer_request(self) -> HostLookupRequest:
        return HostLookupRequest(self)


class HostLookupRequest:
    def __init__(self, lookup: HostLookup) -> None:
        rows = lookup.table.rows
        self._rows = rows
        self._ids = ov.Tensor(lookup.table.ids_type, ov.Shape([1, lookup.chunk_tokens]))
        self._out = np.zeros((1, lookup.chunk_tokens, rows.shape[1]), lookup.table.out_dtype)
        self._out_tensor = ov.Tensor(self._out, shared_memory=True)

    def set_tensor(self, port: str | Any, tensor: ov.Tensor) -> None:
        self._ids = tensor

    def get_tensor(self, port: str | Any) -> ov.Tensor:
        return self._ids

    def get_output_tensor(self, index: int = 0) -> ov.Tensor:
        return self._out_tensor

    def infer(self) -> None:
        ids = np.asarray(self._ids.data).reshape(-1)
        vocabulary = self._rows.shape[0]
        # Gather's rule: a negative id counts from the end, one out of range gives zeros.
        valid = (ids >= -vocabulary) & (ids < vocabulary)
        self._out[0] = self._rows[np.where(valid, ids, 0)]
        if not valid.all():
            self._out[0][~valid] = 0


class CutCompiledModel(ComposedModel):
    """A cut graph with the shared embedding before it and the shared head after it
    (either may be absent); what ``Session`` and ``warm_up`` use of a compiled model."""

    def __init__(
        self,
        body: CompiledGraph,
        head: ov.CompiledModel | None,
        embedding: ov.CompiledModel | HostLookup | None,
    ) -> None:
        self.body, self.head, self.embedding = body, head, embedding
        own = [p for p in body.inputs if EMBEDS_INPUT not in p.names]
        taken = {n for p in own for n in p.names}
        extra = [p for p in (embedding.inputs if embedding else []) if not taken & set(p.names)]
        self._inputs = [*own, *extra]
        # The head's outputs where the hidden state was: the uncut graph's order.
        ends = head.outputs if head is not None else []
        self._outputs = [
            q for p in body.outputs for q in (ends if HIDDEN_OUTPUT in p.names else [p])
        ]

    def create_infer_request(self) -> CutInferRequest:
        return CutInferRequest(self)


class CutInferRequest:
    """Runs the embedding, the cut graph on its embeddings, then the head on the hidden
    state it returned; each hand-off bound, not copied."""

    def __init__(self, compiled: CutCompiledModel) -> None:
        self._body = compiled.body.create_infer_request()
        self._head = compiled.head.create_infer_request() if compiled.head else None
        self._embedding = compiled.embedding.create_infer_request() if compiled.embedding else None
        head_ports = compiled.head.outputs if compiled.head else []
        self._head_input = compiled.head.inputs[0] if compiled.head else None
        self._head_outputs = {n for p in head_ports for n in p.names}
        self._lookup_inputs = {
            n for p in (compiled.embedding.inputs if compiled.embedding else []) for n in p.names
        }
        self._body_inputs = {n for p in compiled.body.inputs for n in p.names}

    def set_tensor(self, port: str | Any, tensor: ov.Tensor) -> None:
        names = _names(port)
        name = port if isinstance(port, str) else port.get_any_name()
        if self._embedding is not None and names & self._lookup_inputs:
            self._embedding.set_tensor(name, tensor)
        if names & self._body_inputs:
            self._body.set_tensor(name, tensor)

    def get_tensor(self, port: str | Any) -> ov.Tensor:
        name = port if isinstance(port, str) else port.get_any_name()
        if self._head is not None and name in self._head_outputs:
            return self._head.get_tensor(name)
        if self._embedding is not None and name in self._lookup_inputs - self._body_inputs:
            return self._embedding.get_tensor(name)
        return self._body.get_tensor(port)

    def query_state(self) -> list[Any]:
        return list(self._body.query_state())

    def infer(self) -> None:
        # Each output tensor may move between calls: bound again each call, not copied.
        if self._embedding is not None:
            self._embedding.infer()
            self._body.set_tensor(EMBEDS_INPUT, self._embedding.get_output_tensor(0))
        self._body.infer()
        if self._head is not None:
            self._head.set_tensor(self._head_input, self._body.get_tensor(HIDDEN_OUTPUT))
            self._head.infer()


class SharedEnds:
    """One compiler's head and embedding models: each made on the first cut graph that
    needs it, then reused. Part of the ``Compiler`` (it reads the compiler's Core, lock,
    keys and compile properties)."""

    def __init__(self, compiler: Compiler) -> None:
        self._compiler = compiler
        self._lock = threading.Lock()
        # label -> (compiled model, the imported blob's mapping to keep alive)
        self._models: dict[str, tuple[ov.CompiledModel, np.ndarray | None]] = {}
        self.compiles = 0  # models this compiler compiled (not imported from a hit)
        self._table: HostTable | None = None
        self._table_read = False

    def attach(self, program: Program) -> Program:
        """``program`` with its head and embedding where its graph was cut."""
        chunk = embedding_chunk(program.compiled)
        if not is_cut(program.compiled) and chunk is None:
            return program
        head = self.get(HEAD_SPECIALIZATION) if is_cut(program.compiled) else None
        embeds = next((p for p in program.compiled.inputs if EMBEDS_INPUT in p.names), None)
        lookup = self.lookup(embeds) if embeds is not None else None
        cut = CutCompiledModel(program.compiled, head, lookup)
        return dataclasses.replace(program, compiled=cut)

    def lookup(self, embeds: Any) -> ov.CompiledModel | HostLookup:
        """The lookup that feeds a cut graph's ``embeds`` input: on the host where the
        table's rows are what the port takes, else the chunk's lookup model."""
        chunk = int(embeds.get_partial_shape()[1].get_length())
        with self._lock:
            table = self._host_table()
        hidden = int(embeds.get_partial_shape()[2].get_length())
        dtype = np.dtype(embeds.get_element_type().to_dtype())
        if table is not None and table.rows.shape[1] == hidden and dtype == table.out_dtype:
            return HostLookup(table, chunk)
        return self.get(f"{EMBEDDING_PREFIX}{chunk}")

    def get(self, label: str) -> ov.CompiledModel:
        with self._lock:
            if label not in self._models:
                if self._compiler.load_mode is LoadMode.IMPORT:
                    self._models[label] = self._through_store(label)
                else:
                    compiled, _ = self._compile(label, self._compiler.properties)
                    self._models[label] = (compiled, None)
            return self._models[label][0]

    def build(self, chunk_tokens: int) -> int:
        """Make sure the head's and the ``chunk_tokens`` embedding's blobs are in the store
        (IMPORT mode); their bytes. A part the model cannot cut is skipped (its graphs
        were not cut either: the same walk)."""
        stored = 0
        labels = [HEAD_SPECIALIZATION]
        with self._lock:
            if self._host_table() is None:
                labels.append(f"{EMBEDDING_PREFIX}{chunk_tokens}")
        for label in labels:
            try:
                outcome = self._stored(label, map_payload=False)
            except PartRefused:
                continue
            outcome.discard()
            stored += outcome.size_bytes
        return stored

    def _host_table(self) -> HostTable | None:
        """The table the host looks embeddings up in, read once (under ``_lock``): from
        the IR as read (its .bin mapped, nothing converted) unless the compiler prepares
        its graphs otherwise (compressed: their table is not the IR's) or has them in
        memory already."""
        if not self._table_read:
            compiler = self._compiler
            if compiler._prepared.started or compiler.compression.mode is not CompressionMode.NONE:
                llm = compiler.llm()
                model, roles = llm.model, llm.roles
            else:
                model, roles = read_ir(compiler.model_dir.xml_path), compiler.roles()
            self._table = host_table(model, roles)
            self._table_read = True
        return self._table

    def _model(self, label: str) -> ov.Model:
        llm = self._compiler.llm()
        with self._compiler._llm_lock:  # clones of one model, one at a time
            if label == HEAD_SPECIALIZATION:
                return head_model(llm.model, llm.roles)
            return embedding_model(llm.model, llm.roles, int(label[len(EMBEDDING_PREFIX) :]))

    def _compile(
        self, label: str, properties: Mapping[str, Any], to_export: bool = False
    ) -> tuple[ov.CompiledModel, float]:
        compiler = self._compiler
        try:
            model = self._model(label)
        except RewriteRefused as exc:
            raise PartRefused(f"{label} cannot be compiled apart: {exc}") from exc
        properties = {**properties, **compiler.profile.part_properties(compiler.properties)}
        inside = to_export and compiler.profile.exports_inside_compile(
            compiler.blob_mode, properties
        )
        began = time.perf_counter()
        try:
            with throwaway_cache(inside) as cache:  # as a rung's (Compiler._compile_to)
                compiled = compiler.core.compile_model(
                    model, compiler.device, {**properties, **cache}
                )
        except RuntimeError as exc:
            raise CompileError(
                f"{compiler.device} failed to compile {label}: {openvino_message(exc)}"
            ) from exc
        self.compiles += 1
        return compiled, time.perf_counter() - began

    def _through_store(self, label: str) -> tuple[ov.CompiledModel, np.ndarray]:
        """The part imported from the store; a blob made (or fetched) here is served by
        the import that validated it: a second import would hold the part's weights
        twice where a named weights bank keeps every import's tensors (NPUW)."""
        validated: list[tuple[ov.CompiledModel, np.ndarray]] = []
        outcome = self._stored(label, map_payload=True, keep=validated.append)
        try:
            if validated:
                return validated[-1]
            mapping = outcome.payload if outcome.payload is not None else map_file(outcome.path)
            return self._compiler._import(mapping, outcome.path.name)
        finally:
            outcome.discard()

    def _stored(
        self,
        label: str,
        map_payload: bool,
        keep: Callable[[tuple[ov.CompiledModel, np.ndarray]], None] | None = None,
    ) -> BlobOutcome:
        compiler = self._compiler
        key = compiler.part_key(label)

        def produce(path: Path) -> ProducedBlob:
            assert compiler._compile_properties is not None  # completed by part_key
            compiled, compile_s = self._compile(label, compiler._compile_properties, True)
            try:
                with path.open("wb") as f:
                    sink = FileSink(f)
                    compiled.export_model(sink)
                    size = sink.finish()
            except OSError as exc:
                if isinstance(exc, PayloadWriteError):
                    raise
                raise PayloadWriteError(exc.errno or errno.EIO, f"export failed: {exc}") from exc
            metadata = {"specialization": label, "device": compiler.device}
            return ProducedBlob(compile_s=compile_s, size_bytes=size, metadata=metadata)

        def validate(path: Path) -> None:
            imported = compiler.import_blob(path)
            if keep is not None:
                keep(imported)

        check = None if compiler.facts.offline else validate  # an absent device cannot import
        return compiler.store.get_or_create(key, produce, validate=check, map_payload=map_payload)
