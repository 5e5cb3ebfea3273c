"""Graph normalization between stateful -> stateless and the static reshape.

Owns the rewrites that make a stateless LLM graph's shape subgraphs and output names
hold up under a static reshape, whatever exporter wrote them. Each rule looks at what
the graph computes, never at an exporter's name, and ``normalize`` reports what fired.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovspec.errors import ModelError
from ovspec.ir.roles import kv_past_parameter

RULE_BROADCAST = "keep-dims-in-bidirectional-broadcasts"
RULE_PRESENT_NAMES = "unique-present-names"


@dataclass(frozen=True)
class Rewrite:
    """One change a rule made: which rule, at which node, and what it did."""

    rule: str
    node: str
    detail: str


@dataclass(frozen=True)
class NormalizeReport:
    rewrites: tuple[Rewrite, ...] = ()

    def by_rule(self, rule: str) -> tuple[Rewrite, ...]:
        return tuple(r for r in self.rewrites if r.rule == rule)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.rewrites:
            counts[r.rule] = counts.get(r.rule, 0) + 1
        return ", ".join(f"{rule} x{n}" for rule, n in counts.items()) or "none"


def normalize(model: ov.Model, infer_types: bool = True) -> NormalizeReport:
    """Apply every rule to a stateless ``model`` in place; returns what changed.

    ``infer_types=False`` leaves the types downstream of a rewritten node to the
    caller's next whole-graph pass (``specialize`` makes one after its reshape; one
    pass here is ~60 ms on the 0.5B preset)."""
    if model.get_variables():
        raise ModelError("normalize runs on the stateless graph; convert the stateful one first")
    rewrites = keep_dims_in_bidirectional_broadcasts(model)
    if rewrites and infer_types:  # renames (rule 2) change no type
        model.validate_nodes_and_infer_types()
    rewrites += unique_present_names(model)
    return NormalizeReport(tuple(rewrites))


# -- rule 1: a 0 in a bidirectional broadcast's target that means "keep" ------------------
#
# openvino-genai's GGUF builder repeats each KV head for GQA as
# Broadcast(BIDIRECTIONAL, target = [batch, kv_heads, group, 0, head_dim]): the 0 means
# "keep" (Reshape's special_zero convention) but Broadcast reads it as an empty axis. It
# type-checks while the sequence axis is dynamic, and the CPU plugin never evaluates it
# (it fuses the repeat into its SDPA-with-KV-cache op); a static reshape validates it and
# fails with "Broadcast incorrect target shape. Expecting either 1 or 33. Got 0".
#
# The repair: target := Maximum(target, floor), floor = min(max(dim - 1, 0), 1) of the
# data's own shape (1 where the data's dim is > 1, else 0), left-padded with zeros to the
# target's rank. In bidirectional mode 1 means "take the data's dim", so the result
# changes only where the original is invalid (0 against a dim > 1) and is exact wherever
# it is defined (a data dim of 0 or 1 keeps its 0). It does not matter how the target is
# computed (literal or a ShapeOf chain that only becomes 0 after reshape), and every op
# added propagates value bounds, so after the reshape the target is a known constant.


def keep_dims_in_bidirectional_broadcasts(model: ov.Model) -> list[Rewrite]:
    rewrites: list[Rewrite] = []
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Broadcast":
            continue
        if str(node.get_attributes().get("mode", "")).lower() != "bidirectional":
            continue
        target_rank = _static_vector_length(node.input_value(1))
        out = node.output(0).get_partial_shape()
        real = _real_data_axes(node.input_value(0).get_partial_shape(), target_rank)
        if target_rank is None or real is None or out.rank.is_dynamic:
            continue
        # Axes where the data is real (dynamic or > 1) and the output may be empty.
        may_drop = [
            axis
            for axis, is_real in enumerate(real)
            if is_real and (out[axis].is_dynamic or out[axis].get_length() == 0)
        ]
        if not may_drop:
            continue
        node.input(1).replace_source_output(_floored_target(node, target_rank))
        rewrites.append(
            Rewrite(
                RULE_BROADCAST,
                node.get_friendly_name(),
                f"target := Maximum(target, 1 where the data's dim > 1) on axes {may_drop}",
            )
        )
    return rewrites


def _static_vector_length(value: ov.Output) -> int | None:
    shape = value.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 1 or shape[0].is_dynamic:
        return None
    return int(shape[0].get_length())


def _real_data_axes(data: ov.PartialShape, target_rank: int | None) -> list[bool] | None:
    """Per target axis: True where the data's dim may be > 1 (a 0 there would drop data)."""
    if target_rank is None or data.rank.is_dynamic:
        return None
    offset = target_rank - data.rank.get_length()  # bidirectional aligns trailing axes
    if offset < 0:
        return None
    real = [False] * target_rank
    for i, dim in enumerate(data):
        real[offset + i] = dim.is_dynamic or dim.get_length() > 1
    return real


def _floored_target(node: ov.Node, target_rank: int) -> ov.Output:
    target = node.input_value(1)
    etype = target.get_element_type()
    data_shape = ops.shape_of(node.input_value(0), output_type=etype.get_type_name())
    one = ops.constant(np.array([1]), etype)
    zero = ops.constant(np.array([0]), etype)
    floor = ops.minimum(ops.maximum(ops.subtract(data_shape, one), zero), one)
    data_rank = node.input_value(0).get_partial_shape().rank.get_length()
    if target_rank > data_rank:
        pad = ops.constant(np.zeros(target_rank - data_rank), etype)
        floor = ops.concat([pad, floor], 0)
    return ops.maximum(target, floor).output(0)


# -- rule 2: KV outputs that share a name --------------------------------------------------
#
# stateful -> stateless names a present output after the tail of its variable id.
# openvino-genai names value variables "past_key_values.N.valuepresent.N.key" (sic), so
# the key and the value outputs of a layer both become "present.N.key"; anything that
# looks results up by name then silently reads one of them twice. A colliding KV result
# is renamed after the past input its Concat reads: past_key_values.N.value ->
# present.N.value (the Concat links the two, not the name).


def unique_present_names(model: ov.Model) -> list[Rewrite]:
    kv_results = [(r, kv_past_parameter(r.input_value(0).get_node())) for r in model.get_results()]
    pairs = [(r, p) for r, p in kv_results if p is not None]
    counts: dict[str, int] = {}
    for result, _ in pairs:
        for name in result.output(0).names:
            counts[name] = counts.get(name, 0) + 1
    renaming = [
        (r, p)
        for r, p in pairs
        if not r.output(0).names or any(counts[n] > 1 for n in r.output(0).names)
    ]
    moving = {r.get_instance_id() for r, _ in renaming}
    taken = {
        name
        for r in model.get_results()
        if r.get_instance_id() not in moving
        for name in r.output(0).names
    }
    rewrites: list[Rewrite] = []
    for result, past in renaming:
        past_name = past.output(0).get_any_name()
        new = present_name_for(past_name)
        if new in taken:
            raise ModelError(
                f"KV output {result.get_friendly_name()} (its Concat reads {past_name}) shares "
                f"its name with another KV output, and the name {new!r} derived from the "
                "past input is taken too; expected one distinct name per present output"
            )
        old = result.output(0).get_any_name() if result.output(0).names else "<unnamed>"
        result.output(0).get_tensor().set_names({new})
        taken.add(new)
        if old != new:  # of a colliding pair, the one whose name was right stays quiet
            detail = f"{old} -> {new}"
            rewrites.append(Rewrite(RULE_PRESENT_NAMES, result.get_friendly_name(), detail))
    return rewrites


def present_name_for(past_name: str) -> str:
    """The present output name that mirrors a past input's (``past_key_values.0.value`` ->
    ``present.0.value``)."""
    for prefix in ("past_key_values", "past"):
        if past_name.startswith(prefix):
            return "present" + past_name[len(prefix) :]
    return past_name + ".present"
