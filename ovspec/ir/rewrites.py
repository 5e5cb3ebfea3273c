"""Graph rewrites that make a specialization as fast and lean as the dynamic model.

Owns the rewrite set a specialization is built with (a blob key component), applies it,
and owns split attention (the past block's scores read straight from the KV input, GQA
folded into query rows, the chunk's own block through an SDPA, one exact log-sum-exp
merge); the rewrites of inputs and outputs are in ``ir.graph_io``. Every site is found
from the roles (past parameter -> KV Concat -> attention), never by name.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from enum import Enum

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovspec.errors import ModelError
from ovspec.ir.graph_io import (
    RewriteRefused,
    dims,
    guarded_results,
    i64,
    last_position_logits,
    live_tokens_state,
    merged_presents,
)
from ovspec.ir.headcut import cut_embedding, cut_head
from ovspec.ir.roles import KVKind, ModelRoles

log = logging.getLogger(__name__)

_TO_CONCAT = {"Convert", "Gather"}
# transformers' repeat_kv as exported (optimum and genai's GGUF reader alike):
# Unsqueeze(axis 2) -> Broadcast -> Reshape, so query head h reads KV head h // G.
_GQA_REPEAT = ("Unsqueeze", "Broadcast", "Reshape")


class GraphRewrite(Enum):
    """One rewrite of a specialization."""

    SPLIT_ATTENTION = "split-attention"
    LAST_POSITION = "last-position-logits"
    LIVE_STATE = "live-tokens-state"
    MERGED_PRESENTS = "merged-presents"
    RESULT_GUARD = "result-guard"
    SHARED_HEAD = "shared-head"
    SHARED_EMBEDDING = "shared-embedding"


@dataclass(frozen=True)
class RewriteSet:
    """The rewrites a specialization is built with; its ``canonical`` text is in the key."""

    rewrites: frozenset[GraphRewrite] = frozenset()

    def __contains__(self, rewrite: object) -> bool:
        return rewrite in self.rewrites

    @property
    def canonical(self) -> str:
        return "+".join(sorted(r.value for r in self.rewrites)) or "none"

    @classmethod
    def parse(cls, text: str) -> RewriteSet:
        """``"split-attention+last-position-logits"`` or ``"none"``; ``"default"`` is not
        accepted here (the device profile decides the default)."""
        text = text.strip()
        if text in ("", "none"):
            return cls()
        names = {r.value: r for r in GraphRewrite}
        unknown = [p for p in text.replace(",", "+").split("+") if p.strip() not in names]
        if unknown:
            raise ModelError(
                f"unknown rewrite {unknown[0]!r}; choose from {', '.join(names)} or none"
            )
        return cls(frozenset(names[p.strip()] for p in text.replace(",", "+").split("+")))

    @classmethod
    def every(cls) -> RewriteSet:
        """Every rewrite (a device profile picks its default set)."""
        return cls(frozenset(GraphRewrite))


def apply_rewrites(
    model: ov.Model, roles: ModelRoles, rewrites: RewriteSet, prefill: bool, capacity_tokens: int
) -> tuple[str, ...]:
    """Apply ``rewrites`` to a reshaped specialization in place; returns notes on what
    could not be applied (a refused rewrite leaves the graph as it was: fail open).

    Each rewrite reads only shapes the reshape inferred and builds typed nodes, so the
    graph's types are inferred once, at the end (one whole-graph pass, not one per
    rewrite: ~35 ms of a specialization on the 0.5B preset)."""
    notes: list[str] = []
    changed = False
    one_row = not prefill  # the LM head reads one row of the graph's output
    if GraphRewrite.SPLIT_ATTENTION in rewrites:
        try:
            split_attention(model, roles)
            changed = True
        except RewriteRefused as exc:
            notes.append(f"split-attention not applied: {exc}")
    if prefill and GraphRewrite.LAST_POSITION in rewrites:
        try:
            last_position_logits(model, roles)
            changed = one_row = True
        except RewriteRefused as exc:
            notes.append(f"last-position-logits not applied: {exc}")
    if GraphRewrite.LIVE_STATE in rewrites:
        live_tokens_state(model, roles, capacity_tokens)
        changed = True
    if changed:
        model.validate_nodes_and_infer_types()
    if GraphRewrite.SHARED_HEAD in rewrites:
        try:  # after last-position-logits: the head then reads one row
            cut_head(model, roles, one_row)
        except RewriteRefused as exc:
            notes.append(f"shared-head not applied: {exc}")
    if GraphRewrite.SHARED_EMBEDDING in rewrites:
        try:  # after the types: it reads the embeddings' static shape
            cut_embedding(model, roles)
        except RewriteRefused as exc:
            notes.append(f"shared-embedding not applied: {exc}")
    if GraphRewrite.MERGED_PRESENTS in rewrites:
        try:  # last: it compares the presents' inferred shapes (its new ops type themselves)
            merged_presents(model, roles)
        except RewriteRefused as exc:
            notes.append(f"merged-presents not applied: {exc}")
    if GraphRewrite.RESULT_GUARD in rewrites and guarded_results(model):
        model.validate_nodes_and_infer_types()  # last: it guards the final Results
    for note in notes:
        log.warning("%s", note)
    return tuple(notes)


# -- attention sites ----------------------------------------------------------------


@dataclass(frozen=True)
class AttentionSite:
    """One SDPA whose K and V are ``Concat(past, new)`` along the sequence axis 2."""

    layer: int
    sdpa: ov.Node
    key_concat: ov.Node
    value_concat: ov.Node
    kv_heads: int
    groups: int  # query heads per KV head
    head_dim: int

    @property
    def query(self) -> ov.Output:
        return self.sdpa.input_value(0)

    @property
    def mask(self) -> ov.Output:
        return self.sdpa.input_value(3)

    @property
    def scale(self) -> ov.Output | None:
        return self.sdpa.input_value(4) if self.sdpa.get_input_size() > 4 else None


def _data_consumers(out: ov.Output) -> list[ov.Input]:
    # Shape-only readers (the normalize rule's ShapeOf, mask builders) are not data paths.
    return [t for t in out.get_target_inputs() if t.get_node().get_type_name() != "ShapeOf"]


def _kv_concat_of(param: ov.Node) -> ov.Node:
    """Follow a past parameter forward (through Convert/Gather) to its KV Concat."""
    queue = deque([param.output(0)])
    while queue:
        out = queue.popleft()
        for target in _data_consumers(out):
            node = target.get_node()
            kind = node.get_type_name()
            if kind == "Concat" and target.get_index() == 0 and node.get_input_size() == 2:
                return node
            if kind in _TO_CONCAT:
                queue.extend(node.outputs())
    raise RewriteRefused(f"no KV Concat follows {param.get_friendly_name()}")


def _attention_of(concat: ov.Node, port: int) -> tuple[ov.Node, list[ov.Node]]:
    """The SDPA fed at ``port`` by ``concat``, and the GQA repeat ops on the way."""
    for target in _data_consumers(concat.output(0)):
        path: list[ov.Node] = []
        node, index = target.get_node(), target.get_index()
        while node.get_type_name() in _GQA_REPEAT and len(path) < len(_GQA_REPEAT) and index == 0:
            path.append(node)
            nexts = _data_consumers(node.output(0))
            if len(nexts) != 1:
                break
            node, index = nexts[0].get_node(), nexts[0].get_index()
        if node.get_type_name() == "ScaledDotProductAttention" and index == port:
            return node, path
    raise RewriteRefused(f"{concat.get_friendly_name()} does not feed attention input {port}")


def _check_repeat(path: list[ov.Node], kv_heads: int, q_heads: int, layer: int) -> None:
    if not path:
        if kv_heads != q_heads:
            raise RewriteRefused(f"layer {layer}: {q_heads} query heads, {kv_heads} KV, no repeat")
        return
    if tuple(n.get_type_name() for n in path) != _GQA_REPEAT:
        raise RewriteRefused(f"layer {layer}: unknown KV path {[n.get_type_name() for n in path]}")
    axes = path[0].input_value(1).get_node()
    if axes.get_type_name() != "Constant" or [int(a) for a in axes.get_data().ravel()] != [2]:
        raise RewriteRefused(f"layer {layer}: the GQA repeat is not on axis 2; head order unknown")


def _static(dim: ov.Dimension, what: str) -> int:
    if not dim.is_static:
        raise RewriteRefused(f"{what} is dynamic")
    return int(dim.get_length())


def attention_sites(model: ov.Model, roles: ModelRoles) -> list[AttentionSite]:
    """Every attention op reading a KV Concat, checked to be a pattern the rewrite knows."""
    params = {p.output(0).get_any_name(): p for p in model.get_parameters() if p.output(0).names}
    by_layer: dict[int, dict[KVKind, ov.Node]] = {}
    for role in roles.kv:
        if role.past_input not in params:
            raise RewriteRefused(f"no parameter {role.past_input}")
        by_layer.setdefault(role.layer, {})[role.kind] = _kv_concat_of(params[role.past_input])
    sites = []
    for layer, pair in sorted(by_layer.items()):
        if set(pair) != {KVKind.KEY, KVKind.VALUE}:
            raise RewriteRefused(f"layer {layer} lacks a key or a value")
        kc, vc = pair[KVKind.KEY], pair[KVKind.VALUE]
        sdpa, path_k = _attention_of(kc, 1)
        sdpa_v, path_v = _attention_of(vc, 2)
        if sdpa.get_instance_id() != sdpa_v.get_instance_id():
            raise RewriteRefused(f"layer {layer}: K and V feed different attention ops")
        for concat in (kc, vc):
            rank = concat.get_output_partial_shape(0).rank.get_length()
            axis = int(concat.get_attributes()["axis"])
            if rank != 4 or (axis + rank if axis < 0 else axis) != 2:
                raise RewriteRefused(f"layer {layer}: the KV Concat is not [B,H,S,D] on axis 2")
        if sdpa.get_attributes().get("causal", False) or sdpa.get_input_size() < 4:
            raise RewriteRefused(f"layer {layer}: attention without an explicit mask")
        kshape = kc.get_output_partial_shape(0)
        qshape = sdpa.get_input_partial_shape(0)
        if qshape.rank.get_length() != 4:
            raise RewriteRefused(f"layer {layer}: the query is not [B,H,L,D]")
        kv_heads = _static(kshape[1], "the KV head count")
        head_dim = _static(kshape[3], "the head size")
        q_heads = _static(qshape[1], "the query head count")
        if q_heads % kv_heads:
            raise RewriteRefused(f"layer {layer}: {q_heads} query heads over {kv_heads} KV heads")
        _check_repeat(path_k, kv_heads, q_heads, layer)
        _check_repeat(path_v, kv_heads, q_heads, layer)
        mshape = sdpa.get_input_partial_shape(3)
        if mshape.rank.get_length() != 4 or not (
            mshape[1].is_static and mshape[1].get_length() == 1
        ):
            raise RewriteRefused(f"layer {layer}: mask {mshape} is not [B,1,L,S]")
        sites.append(AttentionSite(layer, sdpa, kc, vc, kv_heads, q_heads // kv_heads, head_dim))
    if not sites:
        raise RewriteRefused("no attention reads the KV cache")
    return sites


# -- split attention ----------------------------------------------------------------


def _additive(mask: ov.Output, dtype: ov.Type) -> ov.Output:
    if mask.get_element_type() == ov.Type.boolean:
        lowest = ops.constant(np.array(np.finfo(np.float32).min, dtype=np.float32))
        zero = ops.constant(np.array(0, dtype=np.float32))
        mask = ops.select(mask, zero, lowest).output(0)
    if mask.get_element_type() != dtype:
        mask = ops.convert(mask, dtype).output(0)
    return mask


def _scaled_query(site: AttentionSite) -> ov.Output:
    """Q * scale viewed as [B, Hkv, G*P, D]: row g*P + p is query head kv*G + g at p."""
    q = site.query
    scale = site.scale
    if scale is None:
        scale = ops.constant(np.array(1.0 / np.sqrt(site.head_dim), dtype=np.float32)).output(0)
    if scale.get_element_type() != q.get_element_type():
        scale = ops.convert(scale, q.get_element_type()).output(0)
    q = ops.multiply(q, scale).output(0)
    return ops.reshape(q, i64([0, site.kv_heads, -1, site.head_dim]), True).output(0)


def _length(out: ov.Output, axis: int) -> ov.Output:
    """Dimension ``axis`` of ``out`` as an i64 [1]: a constant when it is static."""
    dim = out.get_partial_shape()[axis]
    return i64([dim.get_length()]) if dim.is_static else dims(out, [axis])


def _merge_through_sdpa(
    name: str,
    qg: ov.Output,
    scores_past: ov.Output,
    chunk_scores: ov.Output,
    chunk_mask: ov.Output,
    new_k: ov.Output,
    new_v: ov.Output,
    past_v: ov.Output,
    capacity: ov.Output,
) -> ov.Output:
    """The chunk block as an SDPA over the new K/V, merged with the past block through
    the chunk's log-sum-exp: one softmax over [past scores, chunk log-sum-exp] gives the
    past probabilities and the chunk block's weight."""
    peak = ops.reduce_max(chunk_scores, i64([-1]), True)
    spread = ops.exp(ops.subtract(chunk_scores, peak))
    lse = ops.add(ops.log(ops.reduce_sum(spread, i64([-1]), True)), peak)
    one = ops.constant(np.array(1.0, dtype=np.float32))
    chunk_out = ops.scaled_dot_product_attention(
        qg, new_k, new_v, chunk_mask, one, causal=False, name=f"{name}/split/chunk"
    )
    probs = ops.softmax(ops.concat([scores_past, lse], -1), -1)
    parts = ops.variadic_split(probs, i64(-1), ops.concat([capacity, i64([1])], 0))
    return ops.add(
        ops.matmul(parts.output(0), past_v, False, False, name=f"{name}/split/context_past"),
        ops.multiply(parts.output(1), chunk_out),
    ).output(0)


def split_attention(model: ov.Model, roles: ModelRoles) -> int:
    """Rewrite every attention site in place; returns how many.

    The past block's scores are ``Q @ K_past^T`` read straight from the past input, GQA
    folded by viewing Q as [B, Hkv, G*P, D] (no KV Concat, Broadcast, Transpose or copy
    of the capacity), and so are the chunk's over the new K; one softmax over the two
    score blocks side by side is attention over (past ++ chunk), and its two parts
    weigh V_past and the new V. Only the scores are concatenated (G*P rows), never K/V.
    The mask is made additive and tiled over the G query groups once for all layers
    (-167 ops and ~8% of the 1..P graph's compile on the 0.5B preset against a 5-D
    reshape pair a layer; step time unchanged; measured s22).

    The first site keeps an SDPA: its chunk block is an SDPA over the new K/V, merged
    with the past through the chunk's log-sum-exp (attention over past ++ chunk is the
    exact log-sum-exp merge of the two). The CPU plugin treats a graph as an LLM (f16
    weights kept, half the bytes read per step) only if it holds an SDPA (DESIGN.md
    §10.15); one is enough, and the other sites skip its ~7 ops (measured, s19).
    """
    sites = attention_sites(model, roles)
    # Layers share their mask: made additive and tiled once per (mask, group count).
    masks: dict[tuple[int, int, int], tuple[ov.Output, ov.Output]] = {}
    for index, s in enumerate(sites):
        name = s.sdpa.get_friendly_name()
        qg = _scaled_query(s)
        past_k, new_k = s.key_concat.input_value(0), s.key_concat.input_value(1)
        past_v, new_v = s.value_concat.input_value(0), s.value_concat.input_value(1)
        capacity = _length(past_k, 2)
        cache = (s.mask.get_node().get_instance_id(), s.mask.get_index(), s.groups)
        if cache not in masks:
            mask = _additive(s.mask, qg.get_element_type())  # [B, 1, P, C+P]
            # Query rows are (g, p): mask row p tiled G times, [B, 1, G*P, C+P].
            tiled = ops.tile(mask, i64([1, 1, s.groups, 1])).output(0)
            masks[cache] = (tiled, capacity)
        tiled, capacity = masks[cache]
        lengths = ops.concat([capacity, i64([-1])], 0)
        scores = ops.add(
            ops.concat(
                [
                    ops.matmul(qg, past_k, False, True, name=f"{name}/split/scores_past"),
                    ops.matmul(qg, new_k, False, True),
                ],
                -1,
            ),
            tiled,
        )
        if index == 0:
            blocks = ops.variadic_split(scores, i64(-1), lengths)
            chunk_mask = ops.variadic_split(tiled, i64(-1), lengths).output(1)
            context = _merge_through_sdpa(
                name,
                qg,
                blocks.output(0),
                blocks.output(1),
                chunk_mask,
                new_k,
                new_v,
                past_v,
                capacity,
            )
        else:
            probs = ops.softmax(scores, -1)
            parts = ops.variadic_split(probs, i64(-1), lengths)
            context = ops.add(
                ops.matmul(
                    parts.output(0), past_v, False, False, name=f"{name}/split/context_past"
                ),
                ops.matmul(parts.output(1), new_v, False, False),
            ).output(0)
        heads = s.kv_heads * s.groups
        out = ops.reshape(context, i64([0, heads, -1, s.head_dim]), True, name=f"{name}/split")
        s.sdpa.output(0).replace(out.output(0))
    return len(sites)
