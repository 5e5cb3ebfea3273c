"""Rewrites of what a specialization takes and returns: the LM head on the last real
row (prefill), the live-tokens state a CPU graph keeps instead of a mask and positions,
every layer's new K/V in one output, and the identity that keeps a Result apart from
the nodes that also read its tensor (NPUW). ``ir.rewrites`` owns the set and applies them.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.op.util import Variable, VariableInfo

from ovspec.errors import ModelError
from ovspec.ir.roles import ModelRoles

# The state variable a LIVE_STATE graph keeps: live KV tokens before the call, i32 [1]
# (the CPU plugin refuses set_state of an i64 variable).
LIVE_TOKENS_VARIABLE = "ovspec.live_tokens"
# The one output of a MERGED_PRESENTS graph: every present output concatenated on its
# batch axis in ``ModelRoles.kv`` order.
PRESENTS_OUTPUT = "ovspec.presents"

_LM_HEAD_PASS_THROUGH = {"Convert", "Add", "Multiply", "Divide", "Tanh"}


class RewriteRefused(Exception):
    """The graph is not a pattern a rewrite knows; the rewrite leaves it unchanged."""


def i64(values: object) -> ov.Output:
    return ops.constant(np.array(values, dtype=np.int64)).output(0)


def dims(out: ov.Output, indices: list[int]) -> ov.Output:
    return ops.gather(ops.shape_of(out, ov.Type.i64), i64(indices), i64(0)).output(0)


def parameter(model: ov.Model, name: str) -> ov.Node:
    for p in model.get_parameters():
        if name in p.output(0).names:
            return p
    raise ModelError(f"the specialization has no input {name!r}")


def head_matmul(model: ov.Model, roles: ModelRoles) -> tuple[ov.Node, ov.Node]:
    """The logits Result and the LM head's MatMul it reads through pass-through ops."""
    result = next((r for r in model.get_results() if roles.logits in r.output(0).names), None)
    if result is None:
        raise RewriteRefused(f"no {roles.logits!r} output")
    node = result.input_value(0).get_node()
    while node.get_type_name() != "MatMul":
        if node.get_type_name() not in _LM_HEAD_PASS_THROUGH or node.get_input_size() == 0:
            raise RewriteRefused(f"the logits come from {node.get_type_name()}, not a MatMul")
        node = node.input_value(0).get_node()
    return result, node


def last_position_logits(model: ov.Model, roles: ModelRoles) -> None:
    """Prefill: the LM head runs on the chunk's last real row only (logits [B, 1, V]).

    The row is the number of unmasked chunk slots minus one, read from the mask's
    last P entries: a right-padded short chunk masks its pads (``runtime.session``).
    """
    _result, node = head_matmul(model, roles)
    hidden = node.input_value(0)
    if hidden.get_partial_shape().rank.get_length() != 3:
        raise RewriteRefused("the LM head's input is not [B, P, H]")
    ids = parameter(model, roles.input_ids).output(0)
    mask = parameter(model, roles.attention_mask).output(0)
    chunk = dims(ids, [1])
    tail = ops.slice(mask, ops.negative(chunk), i64([np.iinfo(np.int64).max]), i64([1]), i64([1]))
    real = ops.reduce_sum(ops.convert(tail, ov.Type.i64), i64([1]), False)  # [B]
    row = ops.subtract(ops.gather(real, i64(0), i64(0)), i64(1))  # scalar
    last = ops.unsqueeze(ops.gather(hidden, row, i64(1)), i64([1]))
    node.input(0).replace_source_output(last.output(0))


# -- live-tokens state (CPU) --------------------------------------------------------


def live_tokens_state(model: ov.Model, roles: ModelRoles, capacity_tokens: int) -> None:
    """The graph keeps its live KV length as state and builds its own mask and positions.

    ``attention_mask`` and ``position_ids`` stop being inputs: past slot j is visible iff
    j < t, the chunk's P tokens are all real and sit at positions t..t+P-1, and the call
    leaves t + P in the state. The runtime sets t when it binds a rung (and nothing per
    step). A state variable and an SDPA make OpenVINO's CPU plugin treat the graph as an
    LLM: f16 weights stay f16 in FullyConnected (DESIGN.md §10.15).
    """
    mask_param = parameter(model, roles.attention_mask)
    ids = parameter(model, roles.input_ids).output(0)
    info = VariableInfo()
    info.variable_id = LIVE_TOKENS_VARIABLE
    info.data_type = ov.Type.i32
    info.data_shape = ov.PartialShape([1])
    variable = Variable(info)
    stored = ops.read_value(ops.constant(np.zeros([1], dtype=np.int32)), variable)
    live = ops.convert(stored, ov.Type.i64).output(0)
    chunk = dims(ids, [1])
    mask_type = mask_param.output(0).get_element_type()
    slots = ops.range(i64(0), i64(capacity_tokens), i64(1), ov.Type.i64)
    past = ops.convert(ops.less(slots, live), mask_type)
    fresh = ops.broadcast(ops.constant(np.array(1), mask_type), chunk)
    mask = ops.unsqueeze(ops.concat([past, fresh], 0), i64([0]))
    for target in list(mask_param.output(0).get_target_inputs()):
        target.replace_source_output(mask.output(0))
    model.remove_parameter(mask_param)
    if roles.position_ids is not None:
        pos_param = parameter(model, roles.position_ids)
        offsets = ops.range(i64(0), ops.squeeze(chunk, i64([0])), i64(1), ov.Type.i64)
        positions = ops.unsqueeze(ops.add(offsets, live), i64([0]))
        if pos_param.output(0).get_element_type() != ov.Type.i64:
            positions = ops.convert(positions, pos_param.output(0).get_element_type())
        for target in list(pos_param.output(0).get_target_inputs()):
            target.replace_source_output(positions.output(0))
        model.remove_parameter(pos_param)
    model.add_sinks([ops.assign(ops.convert(ops.add(live, chunk), ov.Type.i32), variable)])
    if not any(v.get_info().variable_id == LIVE_TOKENS_VARIABLE for v in model.get_variables()):
        model.add_variables([variable])  # add_sinks registers it in some OpenVINO versions


# -- merged present outputs ---------------------------------------------------------


def merged_presents(model: ov.Model, roles: ModelRoles) -> None:
    """Every layer's new K/V in one output, ``PRESENTS_OUTPUT`` [L*B, *present dims
    after the batch], concatenated on the batch axis in ``roles.kv`` order (the session
    reads rows i*B..(i+1)*B as ``roles.kv[i]``): no op a layer, where a new leading axis
    cost an Unsqueeze each (48 of the 0.5B preset's executed nodes; s22).

    A graph whose chunk varies has dynamic outputs, and OpenVINO's CPU plugin appears to
    pay per dynamic output on every call: one output instead of 48 made the 0.5B
    preset's decode step 3.6-4.8% faster (paired, one process, s21). Refused unless
    every present has one element type and shape (K and V of every layer alike) with a
    static batch axis that is not its sequence axis.
    """
    by_name = {name: r for r in model.get_results() for name in r.output(0).names}
    if not roles.kv:
        raise RewriteRefused("the model has no KV")
    results = []
    for role in roles.kv:
        if role.present_output not in by_name:
            raise RewriteRefused(f"no present output {role.present_output!r}")
        results.append(by_name[role.present_output])
    # Every present holds the chunk's new tokens on its sequence axis (inference may
    # bound that dimension differently per layer); the other dims must agree.
    kinds = set()
    for role, r in zip(roles.kv, results, strict=True):
        shape = r.get_input_partial_shape(0)
        if role.seq_axis == 0 or shape.rank.is_dynamic or shape[0].is_dynamic:
            raise RewriteRefused("a present output has no static batch axis to stack on")
        dims = tuple("seq" if i == role.seq_axis else str(d) for i, d in enumerate(shape))
        kinds.add((r.get_input_element_type(0).get_type_name(), dims))
    if len(kinds) != 1:
        raise RewriteRefused("the present outputs differ in element type or shape")
    stacked = ops.concat([r.input_value(0) for r in results], 0)
    stacked.output(0).get_tensor().set_names({PRESENTS_OUTPUT})
    for r in results:
        model.remove_result(r)
    model.add_results([ops.result(stacked)])


def guarded_results(model: ov.Model) -> int:
    """Give each Result whose tensor other nodes also read its own identity Reshape;
    returns how many. NPUW (2026.4) computes wrong values, or refuses an f32/f16 link,
    when a Result's tensor also feeds a later partition; a Convert to the same type is
    no fix (its partitioner then loses parameters)."""
    guarded = 0
    for result in model.get_results():
        source = result.input_value(0)
        if len(source.get_target_inputs()) <= 1:
            continue
        names = result.output(0).get_names()
        identity = ops.reshape(source, i64(list(source.get_shape())), special_zero=False)
        identity.set_friendly_name(f"{result.get_friendly_name()}/result_guard")
        result.input(0).replace_source_output(identity.output(0))
        result.output(0).set_names(names)
        guarded += 1
    return guarded
