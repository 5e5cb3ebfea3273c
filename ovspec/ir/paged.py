"""The PagedAttention form of an LLM IR: OpenVINO's paged-attention transformation (what
genai's default CPU backend compiles) and the LM head on each sequence's last token only.
One dynamic graph serves a prompt chunk and a decode step; its KV is block arrays the
caller owns and binds, one pair per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovspec.errors import ModelError, openvino_message
from ovspec.ir.partition import GraphHalves, split_at

KEY_CACHE_PREFIX = "key_cache."
VALUE_CACHE_PREFIX = "value_cache."
# The paged graph's per-call inputs besides the tokens and their positions.
INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
PAST_LENS = "past_lens"
SUBSEQUENCE_BEGINS = "subsequence_begins"
BLOCK_INDICES = "block_indices"
BLOCK_INDICES_BEGINS = "block_indices_begins"
MAX_CONTEXT_LEN = "max_context_len"
LOGITS = "logits"
# The batched graph's extra input: the flattened token row of each sequence's logits.
LOGITS_INDICES = "logits_indices"


@dataclass(frozen=True)
class PagedModel:
    """The transformed graph, its cache inputs in layer order, and its vocabulary."""

    model: ov.Model
    cache_inputs: tuple[str, ...]
    vocab_tokens: int | None


def paged_model(xml_path: Path, per_sequence_logits: bool = False) -> PagedModel:
    """Read the stateful IR at ``xml_path`` and turn it into the paged form; a model the
    transformation cannot take is a ``ModelError`` naming why. With
    ``per_sequence_logits`` the LM head reads the rows ``logits_indices`` names (one per
    sequence of a batched call) instead of the call's last token."""
    from openvino._offline_transformations import paged_attention_transformation

    try:
        model = ov.Core().read_model(str(xml_path))
    except RuntimeError as exc:
        raise ModelError(
            f"{xml_path} is not a readable OpenVINO IR: {openvino_message(exc)}"
        ) from exc
    if not model.get_variables():
        raise ModelError(
            f"{xml_path} is a stateless IR; the paged graph is made from the stateful one "
            "(optimum-cli's or genai's export)"
        )
    try:
        paged_attention_transformation(model)
    except RuntimeError as exc:
        raise ModelError(
            f"the paged-attention transformation refused {xml_path}: {openvino_message(exc)}"
        ) from exc
    names = [p.get_any_name() for p in model.inputs]
    caches = tuple(n for n in names if n.startswith((KEY_CACHE_PREFIX, VALUE_CACHE_PREFIX)))
    if not caches or LOGITS not in {n for o in model.outputs for n in o.get_names()}:
        raise ModelError(f"{xml_path}: no paged attention or no logits output after the transform")
    if per_sequence_logits:
        selected_tokens_head(model)
    else:
        last_token_head(model)
    vocab = model.output(LOGITS).get_partial_shape()[-1]
    return PagedModel(model, caches, vocab.get_length() if vocab.is_static else None)


def _lm_head(model: ov.Model) -> ov.Node:
    node = model.output(LOGITS).get_node().input_value(0).get_node()
    while node.get_type_name() != "MatMul":
        if node.get_input_size() == 0:
            raise ModelError("the logits output is not a MatMul's: no LM head to slice")
        node = node.input_value(0).get_node()
    return node


def last_token_head(model: ov.Model) -> None:
    """Feed the LM head's MatMul only the last token's hidden state (a prompt chunk's
    other rows would cost a vocabulary-wide product each and are never read)."""
    node = _lm_head(model)
    hidden = node.input_value(0)
    last = ops.slice(
        hidden,
        ops.constant(np.array([-1], np.int64)),
        ops.constant(np.array([np.iinfo(np.int64).max], np.int64)),
        ops.constant(np.array([1], np.int64)),
        ops.constant(np.array([0], np.int64)),  # the token axis: tokens are flattened
    )
    node.input(0).replace_source_output(last.output(0))
    model.validate_nodes_and_infer_types()


def selected_tokens_head(model: ov.Model) -> None:
    """Feed the LM head only the token rows a new ``logits_indices`` input names: one per
    sequence in a call that carries several (continuous batching)."""
    node = _lm_head(model)
    indices = ops.parameter(ov.PartialShape([-1]), ov.Type.i64, name=LOGITS_INDICES)
    indices.output(0).get_tensor().set_names({LOGITS_INDICES})
    rows = ops.gather(node.input_value(0), indices, ops.constant(np.array(0, np.int64)))
    node.input(0).replace_source_output(rows.output(0))
    model.add_parameters([indices])
    model.validate_nodes_and_infer_types()


def paged_halves(paged: PagedModel) -> GraphHalves | None:
    """The paged graph cut after its first half of the layers' attention (taken apart in
    place: give it a graph of its own), for two compiles side by side; None for fewer
    than two layers or nothing worth compiling apart."""
    layer_of = {
        n: i for i, n in enumerate(c for c in paged.cache_inputs if c.startswith(KEY_CACHE_PREFIX))
    }
    attention: dict[int, ov.Node] = {}
    for node in paged.model.get_ordered_ops():
        if node.get_type_name() != "PagedAttentionExtension":
            continue
        names = {n for i in node.inputs() for n in i.get_source_output().get_names()}
        layer = next((layer_of[n] for n in names if n in layer_of), None)
        if layer is not None:
            attention[layer] = node
    if len(attention) < 2 or len(attention) != len(layer_of):
        return None
    front = len(attention) // 2
    seeds = [attention[i] for i in range(front)]
    return split_at(paged.model, seeds, front, len(attention))
