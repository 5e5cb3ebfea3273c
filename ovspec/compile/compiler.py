"""Compiling specializations of one model for one device, through the blob store.

A ``Compiler`` prepares the dynamic graph once (read, compress, stateless), keys each
specialization by named components, builds missing blobs into the store (or has a build
delegate build them) and imports them from memory-mapped files, or (``LoadMode.COMPILE``)
compiles each graph from the prepared IR. Its device profile answers every per-device
question. Thread-safe: the loader calls it from a worker while the decode thread imports.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import mmap
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovspec.compile.blobfile import FileSink, map_file, throwaway_cache
from ovspec.compile.delegate import BuildDelegate
from ovspec.compile.devices import DeviceProfile, profile_for
from ovspec.compile.devices.facts import DeviceFacts, compiler_version
from ovspec.compile.graphcheck import mismatch
from ovspec.compile.halves import CompiledGraph, compile_halves
from ovspec.compile.modes import BlobMode, LoadMode
from ovspec.compile.preparing import PreparedModel
from ovspec.compile.programs import BuildOutcome, Program
from ovspec.compile.sharedhead import SharedEnds
from ovspec.errors import CompileError, openvino_message
from ovspec.ir.compression import Compression, CompressionMode
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.partition import split_in_two
from ovspec.ir.rewrites import GraphRewrite, RewriteSet
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import (
    DynamicLLM,
    Specialization,
    serving_spec,
    transforms_id,
)
from ovspec.store.digests import DigestMemo
from ovspec.store.keys import KEY_FORMAT_VERSION, BlobKey
from ovspec.store.local import BlobOutcome, PayloadWriteError, ProducedBlob, Store
from ovspec.store.tier import FETCHED_FROM

log = logging.getLogger(__name__)

# The blob metadata field holding the model's roles (ModelRoles.to_json) as JSON text.
ROLES_METADATA = "roles"

NO_PATCH = "none"


class Compiler:
    """Builds and imports the specializations of one model on one device."""

    def __init__(
        self,
        model_dir: ModelDir,
        device: str,
        properties: Mapping[str, str],
        store: Store,
        compression: Compression | None = None,
        patch_id: str = NO_PATCH,
        memo: DigestMemo | None = None,
        blob_mode: BlobMode = BlobMode.WEIGHTLESS,
        llm: DynamicLLM | None = None,
        rewrites: RewriteSet | None = None,
        load_mode: LoadMode = LoadMode.IMPORT,
        rung_chunk_tokens: int | None = None,
        delegate: BuildDelegate | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.device = device
        self.profile: DeviceProfile = profile_for(device, properties)
        self.properties = self.profile.required_properties(properties)
        self.store = store
        self.compression = compression or Compression()
        self.patch_id = patch_id
        self.blob_mode = blob_mode
        self.rewrites = rewrites if rewrites is not None else self.profile.default_rewrites
        self.load_mode = load_mode
        # With the live-tokens state a prefill graph takes 1..P tokens per call, so it
        # also decodes: given P, COMPILE mode serves the prompt's rung's decode from that
        # graph (``share_rung``); later rungs get static decode graphs.
        self.rung_chunk_tokens = (
            rung_chunk_tokens
            if load_mode is LoadMode.COMPILE and GraphRewrite.LIVE_STATE in self.rewrites
            else None
        )
        # The rung whose decode is served by its prefill graph (the prompt's: share_rung).
        self._shared_rung: int | None = None
        # Completed in ``key`` once the weights' digest is known.
        self._compile_properties: dict[str, str] | None = None
        self.core = ov.Core()  # what this compiler compiles and imports with
        self._prepared = PreparedModel(model_dir, self.compression, llm)
        if load_mode is LoadMode.COMPILE and self.compression.mode is CompressionMode.NONE:
            # Every graph compiles from the IR: read and prepare it while the device is
            # probed (both release the GIL). Not a compression: a bad property would wait
            # minutes for NNCF to refuse.
            self._prepared.start()
        try:
            self.facts: DeviceFacts = self.profile.resolve(self.core, self.properties)
            self.profile.configure_core(self.core, self.properties)
        except BaseException:
            self._prepared.settle()
            raise
        self._memo = memo or store.digest_memo()
        self._roles: ModelRoles | None = None  # from a stored blob's metadata
        self._llm_lock = threading.Lock()
        self._static_values: dict[str, str] | None = None
        # COMPILE mode: graphs alive in some Program, and one gate per graph so two
        # threads asking for the same graph compile it once.
        self._graphs: weakref.WeakValueDictionary[Specialization, CompiledGraph] = (
            weakref.WeakValueDictionary()
        )
        self._gates: dict[Specialization, threading.Lock] = {}
        self._graphs_lock = threading.Lock()
        # Builds each blob elsewhere into the store (the device/host split's host
        # process); this compiler imports what it published.
        self.delegate = delegate
        self.ends = SharedEnds(self)  # the head and embeddings the cut graphs share

    # -- the dynamic graph, prepared once -----------------------------------------

    def llm(self) -> DynamicLLM:
        return self._prepared.get()

    def mapped_weights_address(self, wait: bool = False) -> int | None:
        """Where the prepared model's largest weight lies (None before it is prepared;
        ``wait``: once a preparation started ahead is done, None if none was started);
        the compiler keeps the model, so the address stays valid until ``close``."""
        llm = self._prepared.wait_ahead() if wait else self._prepared.peek()
        return llm.weights_address if llm is not None else None

    def roles(self, hint: Specialization | None = None) -> ModelRoles:
        """The model's roles: from the prepared graph if it is in memory, else from the
        record of a blob this compiler has built or found, or of ``hint``'s blob if the
        store (or its remote tier's manifest) has one (read, not verified or counted:
        roles are names and shapes, checked again when a graph is bound), else by
        preparing the model. A warm start never reads the IR."""
        if self._prepared.started:  # prepared, or being prepared: no store lookups
            return self.llm().roles
        with self._llm_lock:
            if self._roles is not None:
                return self._roles
        if hint is not None:
            record = self.store.record(self.key(hint))
            self._remember_roles(record.metadata if record is not None else {})
            if self._roles is not None:
                return self._roles
        if self.delegate is not None:  # prepared by the delegate, not on the device cores
            roles = self.delegate.roles()
            with self._llm_lock:
                self._roles = roles
            return roles
        return self.llm().roles

    def _remember_roles(self, metadata: Mapping[str, str]) -> None:
        text = metadata.get(ROLES_METADATA)
        if text is None or self._roles is not None:
            return
        try:
            roles = ModelRoles.from_json(json.loads(text))
        except ValueError as exc:  # an older or damaged record: prepare the IR instead
            log.warning("ignoring the roles stored with a blob (%s)", exc)
            return
        if FETCHED_FROM in metadata and not self._local_vocabulary_agrees(roles):
            return
        with self._llm_lock:
            self._roles = roles

    def _local_vocabulary_agrees(self, roles: ModelRoles) -> bool:
        """Whether roles a remote wrote (an unsigned manifest is anyone's) state the
        vocabulary of the model folder here: the ids a prompt may hold are checked
        against it, so it must come from this folder, not from a bucket. config.json's
        ``vocab_size`` vouches for it; without one, or if they differ, the roles are
        not used and the IR (this folder's) answers."""
        local = self.model_dir.config.get("vocab_size")
        agrees = isinstance(local, int) and not isinstance(local, bool)
        log.debug("a remote record's vocabulary %s; config.json %r", roles.vocab_tokens, local)
        return agrees and local == roles.vocab_tokens

    # -- keys ---------------------------------------------------------------------

    def key(self, spec: Specialization) -> BlobKey:
        if self._static_values is None:
            weights_digest = self._memo.digest(self.model_dir.bin_path)
            self._compile_properties = self.profile.compile_properties(
                self.blob_mode, self.properties, weights_digest
            )
            self._static_values = {
                "format": str(KEY_FORMAT_VERSION),
                "ir_structure": self._memo.digest(self.model_dir.xml_path),
                "weights": weights_digest,
                "compression": self.compression.canonical,
                "transforms": transforms_id(self.rewrites),
                "device": self.facts.device,
                "device_architecture": self.facts.architecture,
                "openvino": ov.get_version(),
                "compiler": compiler_version(self.core, self.facts),
                "properties": self.profile.key_properties(self._compile_properties),
                "patch": self.patch_id,
            }
        values = {**self._static_values, "specialization": spec.canonical}
        graph = self._graph_properties(spec)
        if graph:  # only such a graph's key changes
            assert self._compile_properties is not None
            values["properties"] = self.profile.key_properties(
                {**self._compile_properties, **graph}
            )
        return BlobKey.from_values(values)

    def part_key(self, label: str) -> BlobKey:
        """A shared head's or embedding's key: the graphs' components and its ``label``."""
        self.key(Specialization.decode(1))  # completes the static values
        assert self._static_values is not None and self._compile_properties is not None
        part = {**self._compile_properties, **self.profile.part_properties(self.properties)}
        properties = self.profile.key_properties(part)
        values = {**self._static_values, "properties": properties, "specialization": label}
        return BlobKey.from_values(values)

    def _graph_properties(self, spec: Specialization) -> dict[str, str]:
        assert self._compile_properties is not None
        return self.profile.graph_properties(spec, self._compile_properties)

    # -- build and import ---------------------------------------------------------

    def build(self, spec: Specialization) -> BuildOutcome:
        """Make sure the blob of ``spec`` is in the store (and the LM head's and the
        embedding's, when the graphs share them); compile it if it is not."""
        outcome, _ = self._build(spec, keep_import=False)
        if self.rewrites.rewrites & {GraphRewrite.SHARED_HEAD, GraphRewrite.SHARED_EMBEDDING}:
            self.ends.build(spec.chunk_tokens)
        return outcome

    def _build(
        self, spec: Specialization, *, keep_import: bool
    ) -> tuple[BuildOutcome, Program | None]:
        """Build through the store. A new blob is imported once before it is published
        (``validate``): a blob the device cannot import is never stored. With
        ``keep_import`` that import is returned as the program, and a hit is imported
        from the mapping the store verified; a stored blob that verifies but does not
        import is quarantined and rebuilt once."""
        key = self.key(spec)
        imported: list[tuple[ov.CompiledModel, np.ndarray, float]] = []

        def produce(path: Path) -> ProducedBlob:
            compile_s, export_s, size = self._compile_to(spec, path)
            return ProducedBlob(
                compile_s=compile_s,
                size_bytes=size,
                metadata={
                    "specialization": spec.label,
                    "device": self.device,
                    "model": str(self.model_dir.root),
                    "export_s": f"{export_s:.6f}",
                    ROLES_METADATA: json.dumps(self.llm().roles.to_json(), sort_keys=True),
                },
            )

        def validate(path: Path) -> None:
            began = time.perf_counter()
            compiled, backing = self._import(map_file(path), path.name)
            self._check_graph(compiled, spec, path.name)  # a fetched blob may be another's
            imported.append((compiled, backing, time.perf_counter() - began))

        # An absent device (offline NPU compile) cannot import: only the size is proven.
        check = None if self.facts.offline else validate
        for attempt in (1, 2):
            outcome: BlobOutcome = self.store.get_or_create(
                key, produce, validate=check, map_payload=keep_import
            )
            program = None
            try:
                if keep_import:
                    program = self._program(spec, outcome, imported)
            except CompileError as exc:
                if attempt == 2 or not outcome.hit:
                    raise
                why = f"{self.device} cannot import it: {exc}"
                self.store.quarantine(outcome.hex, outcome.checksum or "", why)
                continue
            finally:
                outcome.discard()  # a blob the store did not keep (the mapping holds it)
            self._remember_roles(outcome.metadata)
            built = BuildOutcome(
                spec=spec,
                key_hex=outcome.hex,
                hit=outcome.hit,
                compile_s=outcome.compile_s,
                export_s=float(outcome.metadata.get("export_s", "0") or 0),
                wait_s=outcome.wait_s,
                blob_bytes=outcome.size_bytes,
                path=outcome.path,
                stored=outcome.stored,
                fetched=outcome.fetched,
                fetch_s=outcome.fetch_s,
            )
            if program is not None:
                program = dataclasses.replace(program, build=built)
            return built, program
        raise AssertionError("unreachable")

    def _program(
        self,
        spec: Specialization,
        outcome: BlobOutcome,
        imported: list[tuple[ov.CompiledModel, np.ndarray, float]],
    ) -> Program:
        placeholder = BuildOutcome(spec, outcome.hex, outcome.hit, 0.0, 0.0, 0.0, 0, outcome.path)
        if imported and not outcome.hit:
            compiled, backing, import_s = imported[-1]
            return Program(spec, compiled, placeholder, import_s, backing)
        began = time.perf_counter()
        mapping = outcome.payload if outcome.payload is not None else map_file(outcome.path)
        compiled, backing = self._import(mapping, outcome.path.name)
        # An entry committed before fetched graphs were checked (or by an older ovspec)
        # may be another specialization's: refused here, it is quarantined and rebuilt.
        self._check_graph(compiled, spec, outcome.path.name)
        return Program(spec, compiled, placeholder, time.perf_counter() - began, backing)

    def _check_graph(self, compiled: ov.CompiledModel, spec: Specialization, name: str) -> None:
        """``CompileError`` unless ``compiled`` has the inputs and outputs of ``spec``."""
        why = mismatch(compiled, spec, self.roles(spec))
        if why is not None:
            raise CompileError(f"blob {name} does not serve {spec.label}: {why}")

    def build_ahead(self, spec: Specialization) -> None:
        """Have the build delegate start on ``spec`` now, after what it was asked before
        (the order a serial host builds in); nothing without a delegate."""
        if self.delegate is not None and self.load_mode is LoadMode.IMPORT:
            self.delegate.request(spec)

    def load(self, spec: Specialization, halves: bool = False) -> Program:
        """IMPORT: build if needed, then import the blob from the bytes the store verified.
        COMPILE: compile the specialization (or reuse its rung's graph) from the IR; with
        ``halves`` as two halves side by side (``compile/halves.py``; IMPORT ignores it)."""
        if self.load_mode is LoadMode.COMPILE:
            return self.ends.attach(self._compile_program(spec, halves))
        host = None
        if self.delegate is not None:  # the delegate publishes; the import below hits
            host = self.delegate.build(spec)
        _, program = self._build(spec, keep_import=True)
        assert program is not None  # keep_import=True always imports
        if host is not None:
            build = dataclasses.replace(
                program.build,
                hit=host.hit,
                compile_s=host.compile_s,
                export_s=host.export_s,
                wait_s=host.wait_s,
                host_s=host.host_s,
            )
            program = dataclasses.replace(program, build=build)
        return self.ends.attach(program)

    def import_properties(self) -> dict[str, Any]:
        """What import needs: the runtime config (blobs do not carry it) and, for a
        weightless blob, where the weights are."""
        props: dict[str, Any] = dict(self.properties)
        if self.blob_mode is BlobMode.WEIGHTLESS:
            props["ENABLE_WEIGHTLESS"] = True
            props["WEIGHTS_PATH"] = str(self.model_dir.bin_path)
        return props

    def import_blob(self, path: Path) -> tuple[ov.CompiledModel, np.ndarray]:
        """Import a blob file from a memory map; returns the model and the map to keep
        alive (the file may be removed once this returns)."""
        return self._import(map_file(path), path.name)

    def check_blob(self, path: Path, spec: Specialization) -> None:
        """``CompileError`` unless the blob at ``path`` imports here as ``spec``'s graph."""
        compiled, _ = self.import_blob(path)
        self._check_graph(compiled, spec, path.name)

    def _import(self, mapping: mmap.mmap, name: str) -> tuple[ov.CompiledModel, np.ndarray]:
        # Copy-on-write mapping: OpenVINO wants a writable buffer, and this one reads
        # the file's pages in place without copying the blob through Python bytes.
        backing = np.frombuffer(mapping, dtype=np.uint8)
        try:
            compiled = self.core.import_model(
                ov.Tensor(backing, shared_memory=True), self.device, self.import_properties()
            )
        except RuntimeError as exc:
            raise CompileError(
                f"{self.device} could not import blob {name}: {openvino_message(exc)}"
            ) from exc
        return compiled, backing

    def share_rung(self, capacity_tokens: int) -> None:
        """Serve this rung's decode from its prefill graph (the rung a prompt runs on: its
        graph is compiled anyway); every other rung decodes on a static graph of its own.
        The last call wins: a later prompt on another rung does not make earlier rungs
        keep their slower 1..P graph (one assignment: safe beside a worker's read)."""
        self._shared_rung = capacity_tokens

    def graph_spec(self, spec: Specialization) -> Specialization:
        """The specialization whose graph serves ``spec`` in COMPILE mode."""
        return serving_spec(spec, self.rung_chunk_tokens, self._shared_rung)

    def specialize(self, spec: Specialization) -> ov.Model:
        """``spec`` as a graph with this compiler's rewrites."""
        llm = self.llm()
        with self._llm_lock:  # clones of one model, one at a time
            return llm.specialize(spec, self.rewrites)

    def _compile_program(self, spec: Specialization, halves: bool) -> Program:
        target = self.graph_spec(spec)
        with self._graphs_lock:
            gate = self._gates.setdefault(target, threading.Lock())
        with gate:
            compiled = self._graphs.get(target)
            reused = compiled is not None
            compile_s = 0.0
            if compiled is None:
                compiled, compile_s = self._compile(target, self.properties, halves)
                self._graphs[target] = compiled
                log.debug("compiled %s from the IR in %.3f s", target.label, compile_s)
        outcome = BuildOutcome(
            spec=spec,
            key_hex=self.key(target).hex,
            hit=False,  # not from the store (0 s: the rung's graph was compiled already)
            compile_s=compile_s,
            export_s=0.0,
            wait_s=0.0,
            blob_bytes=0,
            path=Path(),
            stored=False,
        )
        return Program(spec, compiled, outcome, 0.0, np.empty(0, dtype=np.uint8), reused)

    def _compile(
        self, spec: Specialization, properties: Mapping[str, Any], halves: bool = False
    ) -> tuple[CompiledGraph, float]:
        """``spec``'s graph compiled with ``properties``, and the compile's seconds; with
        ``halves`` a ``HalvedCompiledModel`` when the graph has layers enough to cut."""
        if not halves:
            return self._compile_whole(spec, properties)
        model = self.specialize(spec)
        began = time.perf_counter()
        try:
            cut = split_in_two(model, self.llm().roles)
        except RuntimeError as exc:  # halving only saves time: compile the graph whole
            log.warning("compiling %s whole: %s", spec.label, openvino_message(exc))
            return self._compile_whole(spec, properties)
        if cut is None:  # the model is untouched
            return self._compile_whole(spec, properties, model)
        try:
            compiled = compile_halves(self.core, cut, self.device, properties)
        except RuntimeError as exc:
            raise CompileError(
                f"{self.device} failed to compile {spec.label}: {openvino_message(exc)}"
            ) from exc
        return compiled, time.perf_counter() - began

    def _compile_whole(
        self, spec: Specialization, properties: Mapping[str, Any], model: ov.Model | None = None
    ) -> tuple[ov.CompiledModel, float]:
        model = model if model is not None else self.specialize(spec)
        began = time.perf_counter()
        try:
            compiled = self.core.compile_model(model, self.device, dict(properties))
        except RuntimeError as exc:
            raise CompileError(
                f"{self.device} failed to compile {spec.label}: {openvino_message(exc)}"
            ) from exc
        return compiled, time.perf_counter() - began

    def _compile_to(self, spec: Specialization, path: Path) -> tuple[float, float, int]:
        self.key(spec)  # completes the compile properties
        assert self._compile_properties is not None
        properties = {**self._compile_properties, **self._graph_properties(spec)}
        inside = self.profile.exports_inside_compile(self.blob_mode, properties)
        with throwaway_cache(inside) as cache:  # not in the key: thrown away, computes alike
            compiled, compile_s = self._compile_whole(spec, {**properties, **cache})
        began = time.perf_counter()
        try:
            with path.open("wb") as f:
                compiled.export_model(sink := FileSink(f))
                size = sink.finish()
        except PayloadWriteError:
            raise
        except OSError as exc:
            raise PayloadWriteError(exc.errno or errno.EIO, f"export failed: {exc}") from exc
        export_s = time.perf_counter() - began
        log.debug("compiled %s in %.3f s, exported in %.3f s", spec.label, compile_s, export_s)
        return compile_s, export_s, size

    def close(self) -> None:
        self._prepared.settle()
        self._memo.close()
