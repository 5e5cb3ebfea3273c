"""Cutting a specialized graph into a front and a back half that run one after the other.

A CPU compile runs on one thread, so the graph a prompt waits for compiles sooner as two
halves side by side (``compile/halves.py``; DESIGN.md §10.15). The front keeps the state
and the first half of the layers; whatever crosses the cut becomes the back's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.op.util import Variable, VariableInfo

from ovspec.ir.graph_io import PRESENTS_OUTPUT
from ovspec.ir.roles import ModelRoles

# The back's inputs for what the front computes for it: ``HANDOFF_PREFIX``i is the back's
# input for the front's i-th hand-off output (its outputs after its own, in order).
HANDOFF_PREFIX = "ovspec.handoff."
# A do-nothing state a half gets when it would otherwise lose the CPU plugin's LLM mode.
LLM_MARKER_VARIABLE = "ovspec.llm_marker"

_SDPA = "ScaledDotProductAttention"
_NOT_FOLDABLE = {"Parameter", "ReadValue"}


@dataclass(frozen=True)
class GraphHalves:
    """A graph as two models: run ``front``, then ``back`` on what it handed off."""

    front: ov.Model
    back: ov.Model
    # The back's inputs fed by the front, in the order of the front's last outputs.
    handoff: tuple[str, ...]
    front_layers: int  # layers whose new K/V the front computes (their attention is in
    back_layers: int  # the front too, but for the last one's: that one opens the back)


def split_in_two(model: ov.Model, roles: ModelRoles) -> GraphHalves | None:
    """``model`` cut in two about half way through its layers; it is taken apart in
    place, so give it a graph of its own (a fresh specialization). None, with ``model``
    untouched, for a graph with fewer than two layers or when either half would hold no
    MatMul (nothing worth compiling apart).

    The front is every node the first half of the layers' new K/V and the graph's state
    updates depend on: the layers before the cut, and the last front layer's K/V
    projections (its attention opens the back). The back is the rest. Nodes computed
    from constants and input shapes alone (weight decompressions, a chunk's length) are
    in both halves, never handed across: the back's weights stay constants the plugin
    can pack, and its shapes stay as static as the whole graph's. Inputs are read where
    they are needed (by both halves, if both need one). i64 values cross as i32: in an
    LLM graph they are lengths and positions. Each half that lacks a v13 SDPA or a
    state variable while the graph had both gets a tiny one (``LLM_MARKER_VARIABLE``):
    the CPU plugin keeps f16 weights compressed only in a graph it classifies as an
    LLM, by exactly those two things.
    """
    layers = sorted({role.layer for role in roles.kv})
    if len(layers) < 2:
        return None
    front_layers = set(layers[: len(layers) // 2])
    seeds = _front_seeds(model, roles, front_layers)
    return split_at(model, seeds, len(front_layers), len(layers))


def split_at(
    model: ov.Model, seeds: list[ov.Node], front_layers: int, layers: int
) -> GraphHalves | None:
    """``model`` cut after ``seeds`` (the front's last nodes: with every node they depend
    on and the state updates, the front), as ``split_in_two`` cuts it."""
    was_llm = _is_llm_shaped(model)
    front = _ancestors(seeds + list(model.get_sinks()))
    ordered = model.get_ordered_ops()
    matmuls = [node.get_name() in front for node in ordered if node.get_type_name() == "MatMul"]
    if all(matmuls) or not any(matmuls):
        return None
    shareable = _shareable(ordered)

    handoff: dict[tuple[str, int], ov.Output] = {}  # what the back's consumers read instead
    handoff_results: list[ov.Node] = []
    stand_ins: list[ov.Node] = []  # the back's inputs for them
    shared_inputs: dict[str, ov.Node] = {}  # inputs the back reads too, by node name
    for node in ordered:
        if node.get_name() in front:
            continue
        for port in node.inputs():
            source = port.get_source_output()
            producer = source.get_node()
            if producer.get_name() not in front:
                continue
            if producer.get_name() in shareable:  # the back computes it too
                shared_inputs.update(shareable[producer.get_name()])
                continue
            if node.get_type_name() == "Result":
                continue  # an output computed in the front (a front layer's K/V) stays there
            if producer.get_type_name() == "Parameter":
                shared_inputs[producer.get_name()] = producer
                continue
            key = (producer.get_name(), source.get_index())
            if key not in handoff:
                name = f"{HANDOFF_PREFIX}{len(handoff)}"
                handoff[key] = _hand_off(source, name, handoff_results, stand_ins)
            port.replace_source_output(handoff[key])

    front_results: list[ov.Node] = []
    back_results: list[ov.Node] = []
    for result in model.get_results():
        owner = (
            front_results if result.input_value(0).get_node().get_name() in front else back_results
        )
        owner.append(result)
    front_params: list[ov.Node] = []
    back_params: list[ov.Node] = []
    for param in model.get_parameters():
        read_in_back = param.get_name() in shared_inputs or (
            param.get_name() not in front and bool(param.output(0).get_target_inputs())
        )
        if param.get_name() in front or not read_in_back:
            front_params.append(param)  # an unused input stays an input of the front
        if read_in_back:
            back_params.append(param)

    front_model = ov.Model(
        [*front_results, *handoff_results], list(model.get_sinks()), front_params, "front"
    )
    back_model = ov.Model(back_results, [], [*back_params, *stand_ins], "back")
    if was_llm:
        for half in (front_model, back_model):
            if not _is_llm_shaped(half):
                _add_llm_marker(half)
    for half in (front_model, back_model):
        half.validate_nodes_and_infer_types()
    return GraphHalves(
        front_model,
        back_model,
        tuple(f"{HANDOFF_PREFIX}{i}" for i in range(len(handoff))),
        front_layers,
        layers - front_layers,
    )


def _hand_off(
    source: ov.Output, name: str, results: list[ov.Node], stand_ins: list[ov.Node]
) -> ov.Output:
    """``source`` as the front's next hand-off output and the back's input ``name``;
    returns what the back's consumers read. An i64 tensor crosses as i32 (the CPU
    plugin refuses an i64 output; it computes shapes and positions in i32 anyway).
    The source tensor is not renamed: the front's outputs keep the whole graph's names,
    and hand-offs are told apart by position (``compile/halves.py``)."""
    kind = source.get_element_type()
    wide = kind == ov.Type.i64
    carried = ops.convert(source, ov.Type.i32).output(0) if wide else source
    results.append(ops.result(carried))
    stand_in = ops.parameter(source.get_partial_shape(), ov.Type.i32 if wide else kind, name=name)
    stand_in.output(0).get_tensor().set_names({name})
    stand_ins.append(stand_in)
    return ops.convert(stand_in, kind).output(0) if wide else stand_in.output(0)


def _front_seeds(model: ov.Model, roles: ModelRoles, front_layers: set[int]) -> list[ov.Node]:
    """The nodes producing the front layers' new K/V."""
    merged = [r for r in model.get_results() if PRESENTS_OUTPUT in r.output(0).names]
    if merged:  # one Concat of every present, in roles.kv order
        concat = merged[0].input_value(0).get_node()
        return [
            concat.input_value(i).get_node()
            for i, role in enumerate(roles.kv)
            if role.layer in front_layers
        ]
    wanted = {role.present_output for role in roles.kv if role.layer in front_layers}
    return [r.input_value(0).get_node() for r in model.get_results() if wanted & r.output(0).names]


def _ancestors(seeds: list[ov.Node]) -> set[str]:
    """Names of ``seeds`` and of every node they depend on."""
    seen: set[str] = set()
    stack = list(seeds)
    while stack:
        node = stack.pop()
        if node.get_name() in seen:
            continue
        seen.add(node.get_name())
        stack.extend(port.get_source_output().get_node() for port in node.inputs())
    return seen


def _shareable(ordered: list[ov.Node]) -> dict[str, dict[str, ov.Node]]:
    """The nodes computed from constants and the shapes of inputs alone (in topological
    ``ordered``), by name, each with the inputs whose shapes it reads (by name)."""
    found: dict[str, dict[str, ov.Node]] = {}
    for node in ordered:
        kind = node.get_type_name()
        sources = [p.get_source_output().get_node() for p in node.inputs()]
        if kind == "Constant":
            found[node.get_name()] = {}
        elif kind == "ShapeOf" and sources[0].get_type_name() == "Parameter":
            found[node.get_name()] = {sources[0].get_name(): sources[0]}
        elif (
            kind not in _NOT_FOLDABLE
            and sources
            and all(source.get_name() in found for source in sources)
        ):
            found[node.get_name()] = {
                k: v for source in sources for k, v in found[source.get_name()].items()
            }
    return found


def _is_llm_shaped(model: ov.Model) -> bool:
    """What the CPU plugin's ``getModelType`` calls an LLM: a v13 SDPA and a variable."""
    return bool(model.get_variables()) and any(
        node.get_type_name() == _SDPA for node in model.get_ops()
    )


def _add_llm_marker(model: ov.Model) -> None:
    """A [1,1,1,1] SDPA of constants stored into a state nobody reads: it makes the half
    an LLM to the CPU plugin, which then drops it (no request of a half lists it)."""
    info = VariableInfo()
    info.variable_id = LLM_MARKER_VARIABLE
    info.data_shape = ov.PartialShape([1, 1, 1, 1])
    info.data_type = ov.Type.f32
    variable = Variable(info)
    one = ops.constant(np.ones([1, 1, 1, 1], dtype=np.float32))
    model.add_sinks([ops.assign(ops.scaled_dot_product_attention(one, one, one), variable)])
    if not any(v.get_info().variable_id == LLM_MARKER_VARIABLE for v in model.get_variables()):
        model.add_variables([variable])  # add_sinks registers it in some OpenVINO versions
