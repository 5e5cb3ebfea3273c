"""Specialized graphs kept in the store's graphs/ folder, so a warm start in COMPILE mode
neither prepares nor specializes the IR (read + prepare + specialize: ~0.6 s on the
0.5B-shaped model, against ~0.15 s to read a kept graph).

A kept graph is a small IR: every large Constant that is the model's own weight is a
placeholder Parameter naming that weight (its friendly name in the IR), so the files
hold no copy of the weights; loading reads the model's IR once (OpenVINO maps its
``.bin``) and puts the IR's own Constants back in place of the placeholders.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov

from ovspec.compile.host import lower_thread_priority
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import read_ir

log = logging.getLogger(__name__)

# Bump when what a kept graph means changes (the placeholder scheme, the files).
GRAPH_FORMAT = 1
PLACEHOLDER_PREFIX = "ovspec-weight:"
# Constants smaller than this stay in the kept graph's own .bin (new small constants
# of the rewrites, shapes, axes): the weights are what is worth not copying.
MIN_REFERENCED_BYTES = 4096


def graph_key(values: Mapping[str, str]) -> str:
    """The name of a kept graph: a digest of what makes the graph (the IR's and the
    weights' digests, compression, transforms, specialization, OpenVINO version)."""
    text = json.dumps({"graph_format": GRAPH_FORMAT, **values}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class KeptGraph:
    model: ov.Model
    roles: ModelRoles


def ir_constants(model: ov.Model) -> dict[str, ov.Node]:
    """The model's Constants by friendly name, leaving out names used twice."""
    consts = [op for op in model.get_ordered_ops() if op.get_type_name() == "Constant"]
    counts = Counter(op.get_friendly_name() for op in consts)
    return {op.get_friendly_name(): op for op in consts if counts[op.get_friendly_name()] == 1}


class GraphShelf:
    """The graphs/ folder of one writable store (``folder`` None: keeps nothing).

    ``save`` and ``load`` never raise for the shelf's own trouble (a missing, damaged
    or unwritable file): a kept graph is an optimization, the IR is the fallback.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _paths(self, key: str) -> tuple[Path, Path, Path]:
        assert self.folder is not None
        base = self.folder / key
        return base.with_suffix(".xml"), base.with_suffix(".bin"), base.with_suffix(".json")

    def roles(self, key: str) -> ModelRoles | None:
        """The roles recorded with a kept graph, without reading the graph."""
        if self.folder is None:
            return None
        try:
            record = json.loads(self._paths(key)[2].read_text(encoding="utf-8"))
            if record.get("graph_format") != GRAPH_FORMAT:
                return None
            return ModelRoles.from_json(record["roles"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def load(self, key: str, constants: Callable[[], Mapping[str, ov.Node]]) -> KeptGraph | None:
        """The kept graph ``key`` with the IR's Constants (``constants()``, called only
        when the graph is there) in place of its placeholders, or None."""
        roles = self.roles(key)
        if roles is None:
            return None
        xml, weights, _ = self._paths(key)
        try:
            model = ov.Core().read_model(str(xml), str(weights))
        except RuntimeError as exc:
            log.warning("ignoring kept graph %s (%s)", xml.name, exc)
            return None
        by_name = constants()
        for param in list(model.get_parameters()):
            name = param.get_friendly_name()
            if not name.startswith(PLACEHOLDER_PREFIX):
                continue
            const = by_name.get(name[len(PLACEHOLDER_PREFIX) :])
            out = param.output(0)
            if (
                const is None
                or const.get_element_type() != out.get_element_type()
                or const.get_output_partial_shape(0) != out.get_partial_shape()
            ):
                log.warning("ignoring kept graph %s: the IR has no weight %s", xml.name, name)
                return None
            out.replace(const.output(0))
            model.remove_parameter(param)
        model.validate_nodes_and_infer_types()
        return KeptGraph(model, roles)

    def save(self, key: str, model: ov.Model, roles: ModelRoles, ir: Mapping[str, ov.Node]) -> int:
        """Keep ``model`` (not changed: a clone is written) with its weights as
        placeholders; ``ir`` is the IR's Constants by name (``ir_constants`` of a read of
        the model's IR). A weight is a placeholder only if it is the IR Constant of that
        name (``weights_of``).
        Returns the number of placeholders (-1: nothing kept)."""
        if self.folder is None:
            return -1
        xml, weights, meta = self._paths(key)
        tmp = self.folder / f".{key}.{os.getpid()}.{secrets.token_hex(4)}"
        written: list[Path] = []
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.folder, 0o700)
            clone = model.clone()
            weights_found = weights_of(clone, ir)
            for op, name in weights_found:
                param = ov.op.Parameter(op.get_element_type(), op.get_output_partial_shape(0))
                param.set_friendly_name(PLACEHOLDER_PREFIX + name)
                op.output(0).replace(param.output(0))
                clone.add_parameters([param])
            clone.validate_nodes_and_infer_types()
            parts = [Path(f"{tmp}.xml"), Path(f"{tmp}.bin"), Path(f"{tmp}.json")]
            written = parts
            ov.serialize(clone, str(parts[0]), str(parts[1]))
            record = {"graph_format": GRAPH_FORMAT, "roles": roles.to_json()}
            parts[2].write_text(json.dumps(record), encoding="utf-8")
            # The record last: ``roles`` (and so ``load``) sees a graph only when whole.
            os.replace(parts[0], xml)
            os.replace(parts[1], weights)
            os.replace(parts[2], meta)
            return len(weights_found)
        except (OSError, RuntimeError) as exc:
            log.warning("could not keep graph %s (%s)", key, exc)
            for part in written:
                with contextlib.suppress(OSError):
                    part.unlink()
            return -1


class GraphKeeper:
    """One compiler's kept graphs: the shelf, one read of the IR for the weights (begun
    on a thread at once: a warm start needs it while it reads the kept graph), and the
    threads keeping newly specialized graphs (joined by ``close``)."""

    def __init__(self, folder: Path | None, xml_path: Path) -> None:
        self.shelf = GraphShelf(folder)
        self._xml_path = xml_path
        self._constants: dict[str, ov.Node] | None = None
        self._lock = threading.Lock()
        self._keeping: list[threading.Thread] = []
        if folder is not None:
            threading.Thread(target=self._read_early, daemon=True).start()

    def _read_early(self) -> None:
        with contextlib.suppress(Exception):  # read (and raise) again where needed
            self.constants()

    def constants(self) -> dict[str, ov.Node]:
        """The IR's Constants by name, from one read of the IR (its .bin mapped once)."""
        with self._lock:
            if self._constants is None:
                self._constants = ir_constants(read_ir(self._xml_path))
            return self._constants

    def load(self, key: str) -> KeptGraph | None:
        return self.shelf.load(key, self.constants) if self.shelf.folder is not None else None

    def keep_later(self, key: str, model: ov.Model, roles: Callable[[], ModelRoles]) -> None:
        """Keep ``model`` on a thread of low priority (not on the way to a first token)."""
        if self.shelf.folder is None:
            return

        def keep() -> None:
            lower_thread_priority()
            self.shelf.save(key, model, roles(), self.constants())

        thread = threading.Thread(target=keep, name="ovspec-keep-graph")
        thread.start()
        with self._lock:
            self._keeping.append(thread)

    def close(self) -> None:
        with self._lock:
            keeping, self._keeping = self._keeping, []
        for thread in keeping:
            thread.join()


def weights_of(model: ov.Model, ir: Mapping[str, ov.Node]) -> list[tuple[ov.Node, str]]:
    """The large Constants of ``model`` that are the IR's weights, each with the IR
    Constant's name. A Constant is one when the IR (``ir``, its Constants by name,
    read separately) has one of that name, type and shape whose data sits at the same
    place in the mapped ``.bin``: the same distance from the model's copy as most
    weights' (two reads map the file at two addresses), and the same first and last
    bytes. No page of the weights is read beyond those."""
    pairs: list[tuple[ov.Node, str, np.ndarray, np.ndarray]] = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_byte_size() < MIN_REFERENCED_BYTES:
            continue
        name = op.get_friendly_name()
        original = ir.get(name)
        if original is None or (
            op.get_element_type() != original.get_element_type()
            or op.get_output_partial_shape(0) != original.get_output_partial_shape(0)
        ):
            continue
        try:
            x, y = op.get_data(), original.get_data()
        except (RuntimeError, TypeError, ValueError):  # a type numpy cannot view
            continue
        if x.nbytes == y.nbytes and x.flags.c_contiguous and y.flags.c_contiguous:
            pairs.append((op, name, x, y))
    if not pairs:
        return []
    distances = Counter(x.ctypes.data - y.ctypes.data for _, _, x, y in pairs)
    distance, shared = distances.most_common(1)[0]
    found: list[tuple[ov.Node, str]] = []
    for op, name, x, y in pairs:
        a, b = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
        if shared >= 2 and x.ctypes.data - y.ctypes.data == distance:
            same = np.array_equal(a[:64], b[:64]) and np.array_equal(a[-64:], b[-64:])
        else:  # not placed like the other weights: only the bytes can tell
            same = np.array_equal(a, b)
        if same:
            found.append((op, name))
    return found
