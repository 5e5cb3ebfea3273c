"""The rewrites of ir/rewrites.py keep every specialization equal to the stateful model,
and do what they say to the graph (issue 9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from conftest import DirectPrograms, load_llm

from ovspec.compile.devices import profile_for
from ovspec.errors import ModelError
from ovspec.ir.graph_io import LIVE_TOKENS_VARIABLE, PRESENTS_OUTPUT
from ovspec.ir.headcut import EMBEDS_INPUT, HIDDEN_OUTPUT, embedding_model, head_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.ir.rewrites import (
    GraphRewrite,
    RewriteSet,
    apply_rewrites,
)
from ovspec.ir.specialize import Specialization, read_ir
from ovspec.ladder import Ladder
from ovspec.runtime.kv import CopyAndGrowKV
from ovspec.runtime.session import DecodeSession

LADDER = Ladder((32, 64, 128))
SETS = {
    "none": RewriteSet(),
    "split": RewriteSet.parse("split-attention"),
    "npu-default": profile_for("NPU").default_rewrites,
    # Every graph starts at the token embeddings, too (a model of its own per chunk).
    "npu-embedding": RewriteSet(
        profile_for("NPU").default_rewrites.rewrites | {GraphRewrite.SHARED_EMBEDDING}
    ),
    "cpu-default": profile_for("CPU").default_rewrites,
    # CPU's set with one output per present (before merged presents).
    "cpu-separate": RewriteSet.parse("split-attention+last-position-logits+live-tokens-state"),
}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module", params=["qwen2", "llama", "tiny"])
def model_dir(request: pytest.FixtureRequest, tiny_dir: Path) -> Path:
    if request.param == "tiny":
        return tiny_dir
    return Path(__file__).parents[1] / "data" / str(request.param)


# A rung's decode runs on its own graph, or (live-tokens state only: a graph taking 1..P
# tokens) on its prefill graph, as LoadMode.COMPILE serves it.
# With ``halves`` every graph runs as two compiled halves (compile/halves.py), as the
# prompt's graph does at a CPU start.
CASES = (
    [(name, False, False) for name in SETS]
    + [("cpu-default", True, False), ("cpu-separate", True, False)]
    + [("cpu-default", True, True), ("cpu-separate", False, True), ("none", False, True)]
)


@pytest.mark.parametrize(
    ("name", "one_graph", "halves"),
    CASES,
    ids=[f"{n}{'-one-graph' * o}{'-halves' * h}" for n, o, h in CASES],
)
def test_rewritten_rungs_match_the_stateful_model(
    model_dir: Path, name: str, one_graph: bool, halves: bool
) -> None:
    """Teacher-forced logits across two boundaries, prompts shorter than a chunk (the
    first chunk is mostly pads at 0 live tokens), a whole chunk, and longer than a rung."""
    rewrites = SETS[name]
    rng = np.random.default_rng(11)
    llm = load_llm(model_dir)
    control = StatefulRunner(read_ir(model_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES)
    programs = DirectPrograms(
        llm, rewrites=rewrites, rung_chunk_tokens=8 if one_graph else None, halves=halves
    )
    vocab = llm.vocab_tokens or 2048
    for prompt_len in (3, 8, 37):
        prompt = rng.integers(3, vocab, prompt_len).tolist()
        forced = rng.integers(3, vocab, 70 - prompt_len).tolist()
        expected = control.teacher_forced(prompt, forced)
        session = DecodeSession(llm.roles, LADDER, CopyAndGrowKV(llm.roles, 32), programs, 8)
        got = np.stack([session.prefill(prompt)] + [session.step(t) for t in forced])
        session.close()
        assert session.boundaries
        np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
        assert cosine_rows(got, expected).min() >= 0.99999


def test_split_attention_reads_the_past_without_copying_it(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    plain = llm.specialize(Specialization.decode(32))
    split = llm.specialize(Specialization.decode(32), SETS["split"])

    def past_readers(model: ov.Model) -> set[str]:
        past = [p for p in model.get_parameters() if "past_key_values" in p.get_friendly_name()]
        readers = {t.get_node() for p in past for t in p.output(0).get_target_inputs()}
        return {n.get_type_name() for n in readers} - {"ShapeOf"}  # data readers only

    def counts(model: ov.Model, kind: str) -> int:
        return sum(op.get_type_name() == kind for op in model.get_ordered_ops())

    def gqa_repeats(model: ov.Model) -> int:  # [B, Hkv, G, S, D] broadcasts of K or V
        return sum(
            op.get_type_name() == "Broadcast"
            and op.get_output_partial_shape(0).rank.get_length() == 5
            for op in model.get_ordered_ops()
        )

    assert "Concat" in past_readers(plain)
    assert past_readers(split) == {"MatMul"}  # scores and context read the input itself
    assert gqa_repeats(plain) == 4 and gqa_repeats(split) == 0  # 2 layers x K, V
    # One SDPA remains, the first layer's chunk block (what makes the CPU plugin treat
    # the graph as an LLM); the others merge the chunk's scores into the past's softmax.
    assert counts(plain, "ScaledDotProductAttention") == 2
    assert counts(split, "ScaledDotProductAttention") == 1


def test_merged_presents_stack_every_layer_in_role_order(qwen2_dir: Path) -> None:
    """One output holds every present, row i being ``roles.kv[i]``'s new K/V: the
    separate graph's outputs, stacked, whatever order the graph lists its outputs in."""
    llm = load_llm(qwen2_dir)
    spec = Specialization.prefill(32, 8)
    separate = llm.specialize(spec, SETS["cpu-separate"])
    merged = llm.specialize(spec, SETS["cpu-separate"])
    presents = [r for r in merged.get_results() if "logits" not in r.output(0).names]
    for result in presents:  # list the outputs in reverse: the roles' order must win
        merged.remove_result(result)
    merged.add_results(presents[::-1])
    assert apply_rewrites(merged, llm.roles, RewriteSet.parse("merged-presents"), True, 32) == ()
    assert [o.get_any_name() for o in merged.outputs if "logits" not in o.names] == [
        PRESENTS_OUTPUT
    ]
    core = ov.Core()
    rng = np.random.default_rng(3)
    pasts = {
        role.past_input: rng.standard_normal(role.shape(1, 32)).astype(np.float32)
        for role in llm.roles.kv
    }
    outputs = []
    for model in (merged, separate):
        request = core.compile_model(model, "CPU", EXACT_CPU_PROPERTIES).create_infer_request()
        for name, data in pasts.items():
            request.set_tensor(name, ov.Tensor(data))
        state = next(s for s in request.query_state() if s.name == LIVE_TOKENS_VARIABLE)
        state.state = ov.Tensor(np.array([5], dtype=np.int32))
        request.set_tensor("input_ids", ov.Tensor(np.array([[7, 8, 9]], dtype=np.int64)))
        request.infer()
        outputs.append(request)
    stacked = outputs[0].get_tensor(PRESENTS_OUTPUT).data
    one = outputs[1].get_tensor(llm.roles.kv[0].present_output).data.shape
    assert one[0] == 1  # batch 1: layer i is row i
    assert stacked.shape == (len(llm.roles.kv), *one[1:])
    for i, role in enumerate(llm.roles.kv):
        # Two compiled graphs: another CPU may fuse them differently, so not bit for bit.
        expected = outputs[1].get_tensor(role.present_output).data
        np.testing.assert_allclose(stacked[i : i + 1], expected, rtol=1e-5, atol=1e-6)


def test_merged_presents_refuses_presents_of_different_shapes(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    model = llm.specialize(Specialization.decode(32), SETS["cpu-separate"])
    # Make the first layer's key present wider than the others: no common stacked shape.
    key = next(
        r for r in model.get_results() if llm.roles.kv[0].present_output in r.output(0).names
    )
    wider = ov.opset13.concat([key.input_value(0), key.input_value(0)], -1)
    key.input(0).replace_source_output(wider.output(0))
    model.validate_nodes_and_infer_types()
    before = sorted(o.get_any_name() for o in model.outputs)
    notes = apply_rewrites(model, llm.roles, RewriteSet.parse("merged-presents"), False, 32)
    assert notes == (
        "merged-presents not applied: the present outputs differ in element type or shape",
    )
    assert sorted(o.get_any_name() for o in model.outputs) == before


def test_last_position_head_computes_one_row(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    portable = RewriteSet.parse("split-attention+last-position-logits")
    prefill = llm.specialize(Specialization.prefill(32, 8), portable)
    assert list(prefill.output("logits").get_shape())[:2] == [1, 1]
    decode = llm.specialize(Specialization.decode(32), portable)
    assert list(decode.output("logits").get_shape())[:2] == [1, 1]


def test_the_shared_head_cut_ends_every_graph_at_one_hidden_row(qwen2_dir: Path) -> None:
    """Decode and last-position prefill graphs end at the hidden state the one head
    model takes; a prefill whose head reads every row keeps its head (fail open)."""
    llm = load_llm(qwen2_dir)
    head = head_model(llm.model, llm.roles)
    width = head.input(0).get_shape()
    assert list(width)[:2] == [1, 1] and "logits" in head.output(0).names
    for spec in (Specialization.prefill(32, 8), Specialization.decode(32)):
        graph = llm.specialize(spec, SETS["npu-default"])
        names = {n for o in graph.outputs for n in o.names}
        assert "logits" not in names
        assert graph.output(HIDDEN_OUTPUT).get_shape() == width
    every_row = llm.specialize(Specialization.prefill(32, 8), RewriteSet.parse("shared-head"))
    assert list(every_row.output("logits").get_shape())[:2] == [1, 8]


def test_the_shared_embedding_cut_feeds_every_graph_its_embeddings(qwen2_dir: Path) -> None:
    """Static graphs take the embeddings the lookup model returns for their chunk; a
    graph whose chunk varies keeps its lookup (fail open)."""
    llm = load_llm(qwen2_dir)
    for spec in (Specialization.prefill(32, 8), Specialization.decode(32)):
        graph = llm.specialize(spec, SETS["npu-embedding"])
        lookup = embedding_model(llm.model, llm.roles, spec.chunk_tokens)
        shape = lookup.output(0).get_shape()
        assert list(shape)[:2] == [1, spec.chunk_tokens]
        assert graph.input(EMBEDS_INPUT).get_shape() == shape
        assert not any(
            op.get_type_name() == "Gather" and op.get_output_partial_shape(0) == shape
            for op in graph.get_ordered_ops()
        )
    live = RewriteSet(SETS["cpu-default"].rewrites | {GraphRewrite.SHARED_EMBEDDING})
    varying = llm.specialize(Specialization.prefill(32, 8), live)
    assert EMBEDS_INPUT not in {n for p in varying.inputs for n in p.names}


def test_live_state_graph_builds_its_own_mask_and_positions(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    model = llm.specialize(Specialization.prefill(32, 8), SETS["cpu-default"])
    names = {p.get_any_name() for p in model.inputs}
    assert "attention_mask" not in names and "position_ids" not in names
    assert [v.get_info().variable_id for v in model.get_variables()] == [LIVE_TOKENS_VARIABLE]
    assert model.input("input_ids").get_partial_shape()[1] == ov.Dimension(1, 8)
    compiled = ov.Core().compile_model(model, "CPU", EXACT_CPU_PROPERTIES)
    request = compiled.create_infer_request()
    for role in llm.roles.kv:
        request.set_tensor(role.past_input, ov.Tensor(np.zeros(role.shape(1, 32), np.float32)))
    state = next(s for s in request.query_state() if s.name == LIVE_TOKENS_VARIABLE)
    state.state = ov.Tensor(np.array([4], dtype=np.int32))
    for n, after in ((3, 7), (1, 8)):
        request.set_tensor("input_ids", ov.Tensor(np.full((1, n), 5, dtype=np.int64)))
        request.infer()
        assert int(state.state.data[0]) == after  # the call advanced it by its tokens


def test_a_refused_rewrite_leaves_the_graph_as_it_was(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    model = llm.specialize(Specialization.decode(32), SETS["split"])
    before = sorted(op.get_friendly_name() for op in model.get_ordered_ops())
    # Split again: no attention reads a KV Concat any more, so the rewrite refuses.
    notes = apply_rewrites(model, llm.roles, SETS["split"], prefill=False, capacity_tokens=32)
    assert len(notes) == 1 and "split-attention not applied" in notes[0]
    assert sorted(op.get_friendly_name() for op in model.get_ordered_ops()) == before


def test_rewrite_sets_parse_and_name_themselves() -> None:
    every = RewriteSet.every()
    assert every.canonical == (
        "last-position-logits+live-tokens-state+merged-presents+result-guard+"
        "shared-embedding+shared-head+split-attention"
    )
    assert RewriteSet.parse(every.canonical) == every
    portable = RewriteSet.parse("split-attention,last-position-logits")
    assert portable.rewrites == {GraphRewrite.SPLIT_ATTENTION, GraphRewrite.LAST_POSITION}
    assert RewriteSet.parse("none") == RewriteSet() and RewriteSet().canonical == "none"
    with pytest.raises(ModelError, match="unknown rewrite 'fold'"):
        RewriteSet.parse("split-attention+fold")


def test_the_result_guard_gives_each_shared_result_its_own_identity(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    guard = RewriteSet.parse("split-attention+result-guard")
    plain = llm.specialize(Specialization.decode(32), SETS["split"])
    model = llm.specialize(Specialization.decode(32), guard)
    shared = [r for r in plain.get_results() if len(r.input_value(0).get_target_inputs()) > 1]
    assert shared  # the presents also feed the attention that follows them
    assert [sorted(r.output(0).get_names()) for r in model.get_results()] == [
        sorted(r.output(0).get_names()) for r in plain.get_results()
    ]
    for result in model.get_results():
        source = result.input_value(0)
        assert len(source.get_target_inputs()) == 1
    guards = [op for op in model.get_ops() if op.get_friendly_name().endswith("/result_guard")]
    assert len(guards) == len(shared)
    # Computes what the unguarded graph computes, on the CPU plugin.
    core = ov.Core()
    feeds = {
        p.get_any_name(): np.ones(list(p.get_shape()), dtype=p.get_element_type().to_dtype())
        for p in plain.inputs
    }
    a = core.compile_model(plain, "CPU", EXACT_CPU_PROPERTIES).create_infer_request().infer(feeds)
    b = core.compile_model(model, "CPU", EXACT_CPU_PROPERTIES).create_infer_request().infer(feeds)
    for out in plain.outputs:
        np.testing.assert_array_equal(a[out.get_any_name()], b[out.get_any_name()])
