"""Cutting a graph into two halves (ir/partition.py) and running them as one
(compile/halves.py). That the halves decode exactly like the stateful model, across
boundaries, is test_rewrites' ``-halves`` cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from conftest import DirectPrograms, load_llm

import ovspec.ir.partition as partition
from ovspec.builtin import PRESETS, write_model
from ovspec.compile.devices import profile_for
from ovspec.compile.halves import compile_halves
from ovspec.ir.graph_io import LIVE_TOKENS_VARIABLE
from ovspec.ir.partition import HANDOFF_PREFIX, LLM_MARKER_VARIABLE, split_in_two
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import DynamicLLM, Specialization, read_ir, serving_spec
from ovspec.ladder import Ladder
from ovspec.runtime.kv import CopyAndGrowKV
from ovspec.runtime.session import DecodeSession

FIRST_GRAPH = serving_spec(Specialization.prefill(32, 8), 8, 32)  # 1..8 tokens, rung 32


def _graph(llm: DynamicLLM, rewrites: RewriteSet | None = None) -> ov.Model:
    return llm.specialize(FIRST_GRAPH, rewrites or profile_for("CPU").default_rewrites)


def _weight_matmuls(model: ov.Model) -> int:
    """MatMuls whose second input is computed from constants alone (a weight)."""
    constant: set[str] = set()
    for node in model.get_ordered_ops():
        kind = node.get_type_name()
        if kind == "Constant" or (
            kind not in ("Parameter", "ReadValue")
            and node.get_input_size() > 0
            and all(v.get_node().get_name() in constant for v in node.input_values())
        ):
            constant.add(node.get_name())
    return sum(
        node.get_type_name() == "MatMul" and node.input_value(1).get_node().get_name() in constant
        for node in model.get_ops()
    )


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 layers, so the front holds whole layers (with their attention and the state) as
    on a real model; one table for the embedding and the LM head, as Qwen2.5's."""
    spec = dataclasses.replace(PRESETS["tiny"], layers=4, tie_word_embeddings=True)
    return write_model(spec, tmp_path_factory.mktemp("four") / "model")


@pytest.fixture(scope="module", params=["qwen2", "llama", "four-tied"])
def llm(request: pytest.FixtureRequest, four_layers: Path) -> DynamicLLM:
    if request.param == "four-tied":
        return load_llm(four_layers)
    return load_llm(Path(__file__).parents[1] / "data" / str(request.param))


def test_each_half_stays_an_llm_to_the_cpu_plugin(llm: DynamicLLM) -> None:
    """The CPU plugin keeps f16 weights compressed only in what its getModelType calls
    an LLM: a v13 SDPA and a state variable. The whole graph has both; each half must
    (without them the back unpacked its weights to f32: +650 MiB on the 0.5B preset)."""
    whole = _graph(llm)
    assert whole.get_variables()
    halves = split_in_two(_graph(llm), llm.roles)
    assert halves is not None
    for half in (halves.front, halves.back):
        assert half.get_variables()
        assert any(n.get_type_name() == "ScaledDotProductAttention" for n in half.get_ops())
    # The back reads no state of its own: it got the marker. A front of whole layers
    # has the state and the kept SDPA (a 2-layer fixture's front is only layer 0's K/V).
    assert [v.get_info().variable_id for v in halves.back.get_variables()] == [LLM_MARKER_VARIABLE]
    front_variables = {v.get_info().variable_id for v in halves.front.get_variables()}
    whole_layers = {LIVE_TOKENS_VARIABLE}
    assert front_variables == (
        whole_layers if halves.front_layers > 1 else whole_layers | {LLM_MARKER_VARIABLE}
    )


def test_weights_stay_constants_on_both_sides_of_the_cut(llm: DynamicLLM) -> None:
    """Nodes computed from constants (weight decompressions, a tied embedding's convert)
    are shared, never handed across: a weight the back received as an input would be
    neither packed at compile nor kept compressed."""
    whole = _weight_matmuls(_graph(llm))
    halves = split_in_two(_graph(llm), llm.roles)
    assert halves is not None
    front, back = _weight_matmuls(halves.front), _weight_matmuls(halves.back)
    assert front > 0 and back > 0 and front + back == whole
    assert halves.front_layers + halves.back_layers == llm.roles.layers
    assert halves.handoff and all(n.startswith(HANDOFF_PREFIX) for n in halves.handoff)


def test_a_static_graph_stays_static_in_the_back(llm: DynamicLLM) -> None:
    """What the back computes from input shapes (a chunk's length, positions) it computes
    itself: handed across as data, every shape after it would become dynamic."""
    model = llm.specialize(Specialization.decode(32), profile_for("CPU").default_rewrites)
    assert all(out.get_partial_shape().is_static for n in model.get_ops() for out in n.outputs())
    halves = split_in_two(model, llm.roles)
    assert halves is not None
    for half in (halves.front, halves.back):
        dynamic = [
            n.get_friendly_name()
            for n in half.get_ops()
            if any(out.get_partial_shape().is_dynamic for out in n.outputs())
        ]
        assert dynamic == []


@pytest.mark.parametrize("one_graph", [False, True], ids=["static-decode", "one-graph"])
def test_the_halves_decode_as_the_stateful_model(four_layers: Path, one_graph: bool) -> None:
    """Teacher-forced over a boundary, every graph in halves: the prefill graph and static
    decode graphs, or 1..P graphs that also decode (test_rewrites runs the 2-layer
    fixtures the same way)."""
    llm = load_llm(four_layers)
    control = StatefulRunner(
        read_ir(four_layers / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    )
    programs = DirectPrograms(
        llm,
        rewrites=profile_for("CPU").default_rewrites,
        rung_chunk_tokens=8 if one_graph else None,
        halves=True,
    )
    rng = np.random.default_rng(5)
    prompt = rng.integers(3, 2048, 12).tolist()
    forced = rng.integers(3, 2048, 40).tolist()
    expected = control.teacher_forced(prompt, forced)
    session = DecodeSession(llm.roles, Ladder((32, 64)), CopyAndGrowKV(llm.roles, 32), programs, 8)
    got = np.stack([session.prefill(prompt)] + [session.step(t) for t in forced])
    session.close()
    assert len(session.boundaries) == 1
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1)
    assert (cosine / np.linalg.norm(expected, axis=-1)).min() >= 0.99999


def test_a_cut_with_no_matmul_on_one_side_is_refused_untouched(
    llm: DynamicLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _graph(llm)
    ops_before = len(model.get_ops())
    monkeypatch.setattr(partition, "_front_seeds", lambda *_args: [])  # the state alone
    assert split_in_two(model, llm.roles) is None
    assert len(model.get_ops()) == ops_before


def test_a_graph_of_one_layer_is_not_cut(llm: DynamicLLM) -> None:
    model = _graph(llm)
    ops_before = len(model.get_ops())
    one_layer = dataclasses.replace(llm.roles, kv=tuple(r for r in llm.roles.kv if r.layer == 0))
    assert split_in_two(model, one_layer) is None
    assert len(model.get_ops()) == ops_before  # untouched


# CPU's default stacks every present in one output; without it each layer's K/V is an
# output of its own, and the front's last K/V is also handed to the back.
OUTPUTS = {
    "merged-presents": profile_for("CPU").default_rewrites,
    "separate-presents": RewriteSet.parse("split-attention+last-position-logits+live-tokens-state"),
}


@pytest.mark.parametrize("outputs", sorted(OUTPUTS))
def test_the_halved_graph_looks_like_the_whole_one(llm: DynamicLLM, outputs: str) -> None:
    """Inputs and outputs by the whole graph's names (the handoff stays inside), one
    request running both halves, and a clear error for a name neither half has."""
    core = ov.Core()
    rewrites = OUTPUTS[outputs]
    whole = core.compile_model(_graph(llm, rewrites), "CPU", dict(EXACT_CPU_PROPERTIES))
    halves = split_in_two(_graph(llm, rewrites), llm.roles)
    assert halves is not None
    halved = compile_halves(core, halves, "CPU", EXACT_CPU_PROPERTIES)
    assert {p.get_any_name() for p in halved.inputs} == {p.get_any_name() for p in whole.inputs}
    names = [sorted(p.names) for p in halved.outputs]
    assert sorted(names) == sorted(sorted(p.names) for p in whole.outputs)
    requests = (whole.create_infer_request(), halved.create_infer_request())
    ids = np.array([[5, 9, 11]], dtype=np.int64)
    for request in requests:
        for state in request.query_state():  # as a session binds a graph: 0 tokens live
            if state.name == LIVE_TOKENS_VARIABLE:
                state.state = ov.Tensor(np.zeros([1], dtype=np.int32))
        for port in whole.inputs:
            name = port.get_any_name()
            if name == llm.roles.input_ids:
                request.set_tensor(name, ov.Tensor(ids))
            else:
                shape = [d.get_length() for d in port.get_partial_shape()]
                request.set_tensor(name, ov.Tensor(np.zeros(shape, dtype=np.float32)))
        request.infer()
    for port in whole.outputs:
        name = port.get_any_name()
        # Not bit-equal on every CPU: a fusion across the cut may round differently.
        np.testing.assert_allclose(
            requests[1].get_tensor(name).data, requests[0].get_tensor(name).data, 1e-5, 1e-5
        )
    with pytest.raises(RuntimeError, match="no input 'nonesuch'"):
        requests[1].set_tensor("nonesuch", ov.Tensor(ids))
