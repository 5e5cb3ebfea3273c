"""The LM head and the embedding cut out of the rung graphs: each rung ends at the final
hidden state and starts at the token embeddings, and one head model (hidden -> logits)
and one embedding lookup per chunk size (ids -> embeddings) serve every rung, so a ladder
holds their weights and device copies once (``compile/sharedhead.py`` runs them). The
cuts are exact: the models are the very nodes the graphs lose, fed the same tensors; a
lookup that only copies rows of a table (``host_table``) runs on the host instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovspec.ir.graph_io import RewriteRefused, head_matmul
from ovspec.ir.roles import ModelRoles

# The output a cut graph ends with: the final hidden state of the row(s) the head reads.
HIDDEN_OUTPUT = "ovspec.hidden"
# The head model's name and its one input (the hidden state, [1, 1, H]).
HEAD_MODEL_NAME = "ovspec-lm-head"
HEAD_INPUT = "ovspec.head.hidden"
# The input a graph without its embedding takes: the token embeddings, [1, P, H].
EMBEDS_INPUT = "ovspec.embeds"
EMBEDDING_MODEL_NAME = "ovspec-embedding"


def cut_head(model: ov.Model, roles: ModelRoles, one_row: bool) -> None:
    """Replace the logits output with ``HIDDEN_OUTPUT``, the LM head's input, in place.
    ``one_row``: the graph's head reads one row (a decode graph, or a prefill graph whose
    head reads its last row); refused otherwise, as the shared head takes one row."""
    if not one_row:
        raise RewriteRefused("the LM head reads every row of the chunk")
    result, matmul = head_matmul(model, roles)
    hidden = matmul.input_value(0)
    # The logits Result itself returns the hidden state: a Result removed and a new one
    # added made NPUW's folding (2026.4) assert or crash on builtin:small.
    hidden.get_tensor().add_names({HIDDEN_OUTPUT})
    result.input(0).replace_source_output(hidden)
    result.output(0).get_tensor().set_names({HIDDEN_OUTPUT})
    result.validate_and_infer_types()


def head_model(dynamic: ov.Model, roles: ModelRoles) -> ov.Model:
    """The LM head of ``dynamic`` (left untouched) as a model of its own: hidden [1, 1, H]
    in, the graph's logits out (the same nodes and names). ``RewriteRefused`` when the
    head reads anything but the hidden state and constants."""
    model = dynamic.clone()
    result, matmul = head_matmul(model, roles)
    hidden = matmul.input_value(0)
    shape = hidden.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3 or shape[2].is_dynamic:
        raise RewriteRefused(f"the LM head's input is {shape}, not [B, P, H]")
    param = ops.parameter([1, 1, shape[2].get_length()], hidden.get_element_type(), HEAD_INPUT)
    param.output(0).get_tensor().set_names({HEAD_INPUT})
    matmul.input(0).replace_source_output(param.output(0))
    try:
        head = ov.Model([result], [param], HEAD_MODEL_NAME)
        head.validate_nodes_and_infer_types()
    except RuntimeError as exc:  # the head reads another graph input: no cut
        raise RewriteRefused(f"the LM head is not a function of the hidden state: {exc}") from exc
    return head


def _ids_parameter(model: ov.Model, roles: ModelRoles) -> ov.Node:
    found = [p for p in model.get_parameters() if roles.input_ids in p.output(0).names]
    if not found:
        raise RewriteRefused(f"the model has no input named {roles.input_ids}")
    return found[0]


def _embedding_gather(model: ov.Model, roles: ModelRoles) -> ov.Node:
    """The Gather that looks the token ids up in the embedding table (ids via Converts)."""
    ids = _ids_parameter(model, roles)
    frontier, found = [ids.output(0)], []
    while frontier:
        for target in frontier.pop().get_target_inputs():
            node = target.get_node()
            if node.get_type_name() == "Convert":
                frontier.append(node.output(0))
            elif node.get_type_name() == "Gather" and target.get_index() == 1:
                found.append(node)
    if len(found) != 1:
        raise RewriteRefused(f"the token ids index {len(found)} Gathers, not one")
    return found[0]


def cut_embedding(model: ov.Model, roles: ModelRoles) -> None:
    """Feed the graph ``EMBEDS_INPUT`` where its embedding Gather was, in place (its
    token-id input stays: other nodes read its shape). Refused for a chunk that varies."""
    gather = _embedding_gather(model, roles)
    shape = gather.get_output_partial_shape(0)
    if shape.is_dynamic or len(shape) != 3:
        raise RewriteRefused(f"the embeddings are {shape}, not a static [B, P, H]")
    embeds = ops.parameter(shape, gather.get_output_element_type(0), EMBEDS_INPUT)
    embeds.output(0).get_tensor().set_names({EMBEDS_INPUT})
    for target in list(gather.output(0).get_target_inputs()):
        target.replace_source_output(embeds.output(0))
    model.add_parameters([embeds])


def embedding_model(dynamic: ov.Model, roles: ModelRoles, chunk_tokens: int) -> ov.Model:
    """The embedding lookup of ``dynamic`` (left untouched) as a model of its own: token
    ids [1, chunk] in, embeddings [1, chunk, H] out (the same nodes)."""
    model = dynamic.clone()
    gather = _embedding_gather(model, roles)
    ids = _ids_parameter(model, roles)
    result = ops.result(gather.output(0))
    try:
        lookup = ov.Model([result], [ids], EMBEDDING_MODEL_NAME)
        lookup.reshape({ids.output(0): ov.PartialShape([1, chunk_tokens])})
    except RuntimeError as exc:  # the lookup reads another graph input: no cut
        raise RewriteRefused(f"the embedding is not a function of the ids: {exc}") from exc
    return lookup


@dataclass(frozen=True)
class HostTable:
    """An embedding lookup the host does exactly: rows of ``rows`` (a view of the
    constant's own bytes, the .bin's mapping for a read IR) converted to ``out_dtype``."""

    rows: np.ndarray  # [vocabulary, hidden]
    out_dtype: np.dtype[Any]
    ids_type: ov.Type
    ids_names: frozenset[str]
    owner: Any  # the Constant whose bytes ``rows`` views


# Table and output types whose conversion numpy does as OpenVINO's Convert does (exactly).
_HOST_CONVERSIONS = {("f16", "f32"), ("f16", "f16"), ("f32", "f32")}


def host_table(dynamic: ov.Model, roles: ModelRoles) -> HostTable | None:
    """The embedding table of ``dynamic`` when its lookup is a Gather on axis 0 of a
    Constant (or of a Convert of one, f16 to f32) with no batch dims: rows copied and
    widened, which the host does bit for bit. None for any other lookup (a compressed
    table's decompression, say), which stays a model."""
    try:
        gather = _embedding_gather(dynamic, roles)
    except RewriteRefused:  # another lookup, or no ids input of that name
        return None
    data, axis = (gather.input_value(i).get_node() for i in (0, 2))
    if gather.get_attributes().get("batch_dims", 0) != 0 or axis.get_type_name() != "Constant":
        return None
    if [int(v) for v in np.asarray(axis.get_data()).reshape(-1)] != [0]:
        return None
    if data.get_type_name() == "Convert":
        data = data.input_value(0).get_node()
    out_type = gather.get_output_element_type(0)
    if data.get_type_name() != "Constant" or len(data.get_output_shape(0)) != 2:
        return None
    if (data.get_output_element_type(0).get_type_name(), out_type.get_type_name()) not in (
        _HOST_CONVERSIONS
    ):
        return None
    ids = _ids_parameter(dynamic, roles)
    return HostTable(
        rows=data.get_data(),
        out_dtype=np.dtype(out_type.to_dtype()),
        ids_type=ids.get_output_element_type(0),
        ids_names=frozenset(ids.output(0).names),
        owner=data,
    )
