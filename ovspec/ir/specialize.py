"""Specializations: turning one dynamic LLM IR into static decode/prefill graphs.

The steps mirror OpenVINO's NPUW LLM pipeline (DESIGN.md §4): stateful -> stateless,
present outputs carry only the new tokens' K/V, then a static reshape per
(phase, capacity, chunk). The dynamic preparation is done once and cloned per rung.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import openvino as ov

from ovspec.errors import ModelError, arg, openvino_message
from ovspec.ir.normalize import NormalizeReport, normalize
from ovspec.ir.refusals import reshape_refusal
from ovspec.ir.rewrites import GraphRewrite, RewriteSet, apply_rewrites
from ovspec.ir.roles import ModelRoles, discover_roles, kv_past_parameter

# Bump when prepare() or specialize() would make a different graph from the same IR
# (a new rewrite, a changed one): blob keys carry it, so no blob of an older pipeline
# is served for the new one.
# History: 1 — stateful->stateless, new-token-only presents, static reshape (2026-11).
#          2 — normalize after stateful->stateless: bidirectional broadcasts keep real
#              dims, colliding present names renamed (issue 13, 2026-12).
#          3 — the rewrites of ir/rewrites.py (split attention, last-position LM head,
#              live-tokens state; which ones is the key's "rewrites" component), and a
#              live-tokens prefill graph takes a chunk of 1..P tokens (issue 9, 2026-12).
#          4 — split attention merges the chunk's scores into the past block's softmax;
#              only the first layer keeps its chunk SDPA (issue 9, 2026-12-01).
#          5 — the mask is tiled over the query groups once; each layer adds it to its two
#              score blocks side by side (no 5-D reshape pair a layer; issue 9, 2026-12-02).
TRANSFORMS_VERSION = 5


def transforms_id(rewrites: RewriteSet | None = None) -> str:
    """The text blob keys carry for the IR -> specialization pipeline: its version and
    the rewrite set a specialization is built with."""
    return f"ovspec-transforms/{TRANSFORMS_VERSION}:rewrites={(rewrites or RewriteSet()).canonical}"


class Phase(Enum):
    DECODE = "decode"
    PREFILL = "prefill"


@dataclass(frozen=True)
class Specialization:
    """(phase, capacity, chunk): what a static graph is specialized to."""

    phase: Phase
    capacity_tokens: int
    chunk_tokens: int = 1

    def __post_init__(self) -> None:
        if self.capacity_tokens <= 0:
            raise ModelError(f"capacity {self.capacity_tokens} must be positive")
        if self.phase is Phase.DECODE and self.chunk_tokens != 1:
            raise ModelError("a decode specialization takes exactly 1 new token per call")
        if self.chunk_tokens <= 0 or self.chunk_tokens > self.capacity_tokens:
            raise ModelError(
                f"prefill chunk {self.chunk_tokens} must be between 1 and the capacity "
                f"{self.capacity_tokens}; lower {arg('chunk_tokens')}"
            )

    @classmethod
    def decode(cls, capacity_tokens: int) -> Specialization:
        return cls(Phase.DECODE, capacity_tokens, 1)

    @classmethod
    def prefill(cls, capacity_tokens: int, chunk_tokens: int) -> Specialization:
        return cls(Phase.PREFILL, capacity_tokens, chunk_tokens)

    @property
    def label(self) -> str:
        if self.phase is Phase.DECODE:
            return f"decode@{self.capacity_tokens}"
        return f"prefill@{self.capacity_tokens}x{self.chunk_tokens}"

    @property
    def canonical(self) -> str:
        """The text that goes into a blob key."""
        return f"{self.phase.value}:capacity={self.capacity_tokens}:chunk={self.chunk_tokens}"

    @classmethod
    def from_canonical(cls, text: str) -> Specialization:
        """The inverse of ``canonical``; ValueError for any other text."""
        match = re.fullmatch(r"(decode|prefill):capacity=(\d+):chunk=(\d+)", text)
        if match is None:
            raise ValueError(f"{text!r} is not a canonical specialization")
        try:
            return cls(Phase(match[1]), int(match[2]), int(match[3]))
        except ModelError as exc:
            raise ValueError(str(exc)) from exc


def prefill_specialization(capacity_tokens: int, chunk_tokens: int) -> Specialization:
    """The prefill graph for a rung: the chunk shrinks to fit a small rung."""
    return Specialization.prefill(capacity_tokens, min(chunk_tokens, capacity_tokens))


def serving_spec(
    spec: Specialization, rung_chunk_tokens: int | None, shared_rung: int | None
) -> Specialization:
    """The graph that serves ``spec``: the ``shared_rung`` decodes on its prefill
    graph when that graph takes 1..P tokens (the live-tokens rewrite; ``rung_chunk_tokens``
    P, else None): one graph, one copy of the weights, for the rung the prompt runs on.
    Any other spec is served by its own graph (a rung's decode: a static graph, whose
    step is ~10% faster; DESIGN.md §10.15)."""
    if (
        rung_chunk_tokens is None
        or spec.phase is Phase.PREFILL
        or spec.capacity_tokens != shared_rung
    ):
        return spec
    return Specialization.prefill(
        spec.capacity_tokens, min(rung_chunk_tokens, spec.capacity_tokens)
    )


@dataclass(frozen=True)
class DynamicLLM:
    """A stateless LLM graph whose present outputs hold only new tokens; clone to specialize."""

    model: ov.Model
    roles: ModelRoles
    normalized: NormalizeReport = field(default_factory=NormalizeReport)
    # The data address of the largest Constant: read from a file, it lies in OpenVINO's
    # mapping of the .bin, which lives as long as the model (runtime/residency.py).
    weights_address: int | None = None

    @property
    def vocab_tokens(self) -> int | None:
        """The logits' last dimension, if the IR states it."""
        return self.roles.vocab_tokens

    def static_shapes(self, spec: Specialization) -> dict[str, list[int]]:
        chunk, cap = spec.chunk_tokens, spec.capacity_tokens
        shapes = {
            self.roles.input_ids: [1, chunk],
            self.roles.attention_mask: [1, cap + chunk],
        }
        if self.roles.position_ids is not None:
            shapes[self.roles.position_ids] = [1, chunk]
        for role in self.roles.kv:
            shapes[role.past_input] = role.shape(1, cap)
        return shapes

    def specialize(self, spec: Specialization, rewrites: RewriteSet | None = None) -> ov.Model:
        """A static clone of the model for ``spec``, rewritten with ``rewrites`` (none by
        default). With the live-tokens state a prefill graph takes 1..P tokens per call:
        it builds its own mask, so it cannot mask the pads of a short chunk."""
        rewrites = rewrites or RewriteSet()
        model = self.model.clone()
        shapes: dict[str, ov.PartialShape] = {
            name: ov.PartialShape(dims) for name, dims in self.static_shapes(spec).items()
        }
        chunk_varies = spec.phase is Phase.PREFILL and GraphRewrite.LIVE_STATE in rewrites
        if chunk_varies:
            chunk = ov.Dimension(1, spec.chunk_tokens)
            shapes[self.roles.input_ids] = ov.PartialShape([1, chunk])
            shapes[self.roles.attention_mask] = ov.PartialShape(
                [
                    1,
                    ov.Dimension(
                        spec.capacity_tokens + 1, spec.capacity_tokens + spec.chunk_tokens
                    ),
                ]
            )
            if self.roles.position_ids is not None:
                shapes[self.roles.position_ids] = ov.PartialShape([1, chunk])
        unknown = [
            p.output(0).get_any_name()
            for p in model.get_parameters()
            if p.output(0).get_any_name() not in shapes
        ]
        if unknown:
            raise ModelError(
                f"the IR has inputs ovspec cannot give a static shape: {', '.join(unknown)}"
            )
        if not _set_input_shapes(model, shapes) or (model.is_dynamic() and not chunk_varies):
            model = self.model.clone()
            try:
                model.reshape(shapes)
            except RuntimeError as exc:
                raise ModelError(reshape_refusal(spec.label, exc)) from exc
        if model.is_dynamic() and not chunk_varies:
            raise ModelError(f"the IR stays dynamic after reshaping to {spec.label}")
        apply_rewrites(
            model, self.roles, rewrites, spec.phase is Phase.PREFILL, spec.capacity_tokens
        )
        model.set_friendly_name(f"{model.get_friendly_name()}:{spec.label}")
        return model


def _set_input_shapes(model: ov.Model, shapes: Mapping[str, ov.PartialShape]) -> bool:
    """Set the inputs' shapes and infer the graph's: ``Model.reshape`` without its
    SmartReshape passes, which cost 0.27 of its 0.29 s on the 0.5B preset (measured).
    Those passes only rewrite hard-coded shapes that would refuse the new ones, so where
    shape inference succeeds without them the graph computes the same. False (``model``
    left half-changed) where it does not: the caller falls back to ``Model.reshape``."""
    for parameter in model.get_parameters():
        parameter.set_partial_shape(shapes[parameter.output(0).get_any_name()])
    try:
        model.validate_nodes_and_infer_types()
    except RuntimeError:
        return False
    return True


# ConstantFolding skips a node whose rt_info holds this key (``DisableConstantFolding``'s
# type name and version, as OpenVINO's ``constant_folding_is_disabled`` reads it).
HOLD_FOLDING_KEY = "DisableConstantFolding_0"


def hold_weight_lookups(model: ov.Model) -> int:
    """Keep constant folding off each Gather that reads a decompressed weight table (the
    token embedding): returns how many.

    The CPU plugin moves the f16 -> f32 Convert after such a Gather, and OpenVINO's
    ConstantFolding then tries the Gather whenever its output shape is static (a static
    decode graph's is): it converts the whole table to f32 (545 MB on the 0.5B preset)
    before it finds the indices are not constant, and throws it away, in each of its
    11 runs. Held, a static decode graph compiled in 2.2 s instead of 8.0 s, into the
    same compiled model (s21). Only Gathers whose indices are not constant (token ids):
    those can never fold.
    """
    held = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        if op.input_value(1).get_node().get_type_name() == "Constant":
            continue  # a slice of a weight by constant indices: that may fold
        source = op.input_value(0).get_node()
        if (
            source.get_type_name() == "Convert"
            and source.input_value(0).get_node().get_type_name() == "Constant"
            and source.get_input_element_type(0) in (ov.Type.f16, ov.Type.bf16)
        ):
            op.get_rt_info()[HOLD_FOLDING_KEY] = ""
            held += 1
    return held


def largest_weight_address(model: ov.Model) -> int | None:
    """The data address of ``model``'s largest Constant (None without one)."""
    constants = [op for op in model.get_ordered_ops() if op.get_type_name() == "Constant"]
    if not constants:
        return None
    largest = max(constants, key=lambda op: op.get_byte_size())
    return int(largest.data.ctypes.data)  # a view: no copy of the weight


def read_ir(xml_path: Path) -> ov.Model:
    """Read an IR, mapping OpenVINO's parse errors to ``ModelError``."""
    try:
        return ov.Core().read_model(str(xml_path))
    except RuntimeError as exc:
        raise ModelError(
            f"{xml_path} is not a readable OpenVINO IR: {openvino_message(exc)}"
        ) from exc


def prepare(model: ov.Model) -> DynamicLLM:
    """Stateful -> stateless, then point each present output at its new tokens only.

    Mutates ``model`` (read a fresh one, or pass a clone).
    """
    to_stateless(model)
    hold_weight_lookups(model)
    report = normalize(model, infer_types=False)  # specialize infers them after its reshape
    roles = discover_roles(model)
    # Each present result is found by the past input its Concat reads, not by name:
    # names are what exporters get wrong (normalize.py, rule 2).
    by_past: dict[str, ov.Node] = {}
    for result in model.get_results():
        past = kv_past_parameter(result.input_value(0).get_node())
        if past is not None:
            by_past[past.output(0).get_any_name()] = result
    for role in roles.kv:
        result = by_past[role.past_input]
        concat = result.input_value(0).get_node()
        # Input 1 of the KV Concat is the new tokens' K/V (input 0 is the past).
        result.input(0).replace_source_output(concat.input_value(1))
        result.validate_and_infer_types()  # only these changed: no whole-graph pass (60 ms)
    return DynamicLLM(model, roles, report, largest_weight_address(model))


def to_stateless(model: ov.Model) -> None:
    """OpenVINO's stateful -> stateless transformation, in place (no-op if stateless)."""
    if not model.get_variables():
        return
    # Imported here: the offline transformations load a separate native module.
    from openvino._offline_transformations import stateful_to_stateless_transformation

    stateful_to_stateless_transformation(model)
    if model.get_variables():
        raise ModelError("stateful -> stateless left variables in the graph")
