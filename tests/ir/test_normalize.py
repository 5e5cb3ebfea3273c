"""Normalization rules on synthetic graphs: the broadcast repair is exact where the original
is defined and static after reshape however its target is computed; colliding present
names are renamed from the past input; role discovery refuses what it cannot tell apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
from conftest import load_llm

from ovspec.errors import ModelError
from ovspec.ir.normalize import (
    RULE_BROADCAST,
    RULE_PRESENT_NAMES,
    keep_dims_in_bidirectional_broadcasts,
    normalize,
    present_name_for,
    unique_present_names,
)
from ovspec.ir.roles import discover_roles
from ovspec.ir.specialize import Specialization


def gqa_repeat(zero_from_shape: bool) -> ov.Model:
    """data [b, 2, 1, s, 4] -> Broadcast(BIDIRECTIONAL, [b, 2, 2, 0, 4]): genai's GQA repeat.

    ``zero_from_shape``: the 0 is computed from another input's shape (it is only 0 once
    reshaped), the case a look at the dynamic graph's output shape alone would miss.
    """
    data = ops.parameter([-1, 2, 1, -1, 4], np.float32, name="data")
    batch = ops.gather(ops.shape_of(data), ops.constant([0]), ops.constant(0))
    params = [data]
    if zero_from_shape:
        empty = ops.parameter([-1, -1], np.float32, name="empty")
        zero = ops.gather(ops.shape_of(empty), ops.constant([1]), ops.constant(0))
        params.append(empty)
    else:
        zero = ops.constant(np.array([0], dtype=np.int64))
    target = ops.concat([batch, ops.constant([2]), ops.constant([2]), zero, ops.constant([4])], 0)
    out = ops.broadcast(data, target, broadcast_spec="BIDIRECTIONAL")
    return ov.Model([out.output(0)], params, "gqa")


def data_of(seq: int) -> np.ndarray:
    return np.random.default_rng(seq).standard_normal((1, 2, 1, seq, 4)).astype(np.float32)


def run(model: ov.Model, seq: int) -> np.ndarray:
    feed = {"data": data_of(seq)}
    if len(model.inputs) == 2:
        feed["empty"] = np.zeros((1, 0), np.float32)
    result: np.ndarray = ov.Core().compile_model(model, "CPU").infer_new_request(feed)[0]
    return result


@pytest.mark.parametrize("zero_from_shape", [False, True])
def test_static_reshape_fails_before_and_is_exact_after(zero_from_shape: bool) -> None:
    shapes = {"data": [1, 2, 1, 33, 4]} | ({"empty": [1, 0]} if zero_from_shape else {})
    with pytest.raises(RuntimeError, match="Broadcast"):
        gqa_repeat(zero_from_shape).reshape(shapes)
    fixed = gqa_repeat(zero_from_shape)
    rewrites = keep_dims_in_bidirectional_broadcasts(fixed)
    assert [r.rule for r in rewrites] == [RULE_BROADCAST]
    fixed.reshape(shapes)
    assert not fixed.is_dynamic()
    assert list(fixed.output(0).get_shape()) == [1, 2, 2, 33, 4]
    np.testing.assert_array_equal(run(fixed, 33), np.broadcast_to(data_of(33), (1, 2, 2, 33, 4)))


def test_where_the_original_is_defined_the_result_is_unchanged() -> None:
    # A data dim of 1 against the 0: the original gives an empty axis, and so does the rewrite.
    original, fixed = gqa_repeat(False), gqa_repeat(False)
    keep_dims_in_bidirectional_broadcasts(fixed)
    assert run(original, 1).shape == run(fixed, 1).shape == (1, 2, 2, 0, 4)


def test_well_formed_broadcasts_are_left_alone() -> None:
    data = ops.parameter([1, 8, 1], np.float32, name="data")
    target = ops.constant(np.array([3, 1, 1], dtype=np.int64))
    out = ops.broadcast(data, target, broadcast_spec="BIDIRECTIONAL")
    model = ov.Model([out.output(0)], [data])
    assert keep_dims_in_bidirectional_broadcasts(model) == []


def kv_graph(value_name: str) -> ov.Model:
    """Two KV Concats of past parameters, whose outputs carry the names given."""
    results = []
    params = []
    for kind, name in (("key", "present.0.key"), ("value", value_name)):
        past = ops.parameter([-1, 2, -1, 4], np.float32, name=f"past_key_values.0.{kind}")
        new = ops.parameter([-1, 2, -1, 4], np.float32, name=f"new_{kind}")
        concat = ops.concat([past, new], 2)
        result = ops.result(concat)
        result.output(0).get_tensor().set_names({name})
        results.append(result)
        params += [past, new]
    return ov.Model(results, params, "kv")


def test_colliding_present_names_are_renamed_from_the_past_input() -> None:
    model = kv_graph("present.0.key")  # genai's value variable ends in ".key"
    rewrites = unique_present_names(model)
    assert {r.rule for r in rewrites} == {RULE_PRESENT_NAMES}
    names = sorted(r.output(0).get_any_name() for r in model.get_results())
    assert names == ["present.0.key", "present.0.value"]


def test_distinct_present_names_are_kept() -> None:
    model = kv_graph("present.0.value")
    assert unique_present_names(model) == []


def test_present_name_mirrors_the_past_name() -> None:
    assert present_name_for("past_key_values.3.value") == "present.3.value"
    assert present_name_for("past.1.key") == "present.1.key"
    assert present_name_for("cache_k_1") == "cache_k_1.present"


def test_normalize_refuses_a_stateful_graph(qwen2_dir: Path) -> None:
    model = ov.Core().read_model(qwen2_dir / "openvino_model.xml")
    with pytest.raises(ModelError, match="stateless"):
        normalize(model)


def test_optimum_exports_still_specialize_and_report_what_fired(fixture_dir: Path) -> None:
    llm = load_llm(fixture_dir)
    # The optimum exports compute their repeats' targets from ShapeOf: the rule fires
    # (harmlessly, the equivalence tests hold) and says so; their names never collide.
    assert llm.normalized.by_rule(RULE_PRESENT_NAMES) == ()
    assert all(r.rule == RULE_BROADCAST for r in llm.normalized.rewrites)
    assert not llm.specialize(Specialization.decode(32)).is_dynamic()


def test_roles_refuse_two_kv_outputs_with_one_name() -> None:
    # Without normalize, a shared name would be read twice by every name-keyed lookup.
    model = kv_graph("present.0.key")
    hidden = ops.parameter([1, 1, 8], np.float32, name="hidden")
    logits = ops.result(hidden)
    logits.output(0).get_tensor().set_names({"logits"})
    inputs = [ops.parameter([-1, -1], np.int64) for _ in range(2)]
    for param, name in zip(inputs, ("input_ids", "attention_mask"), strict=True):
        param.output(0).get_tensor().set_names({name})
    model.add_results([logits])
    model.add_parameters([*inputs, hidden])
    with pytest.raises(ModelError, match=r"share the name 'present\.0\.key'"):
        discover_roles(model)
