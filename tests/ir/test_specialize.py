"""Static specializations compute what the dynamic stateful model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from conftest import DirectPrograms, load_llm, no_kv_graph
from openvino.passes import ConstantFolding, Manager

from ovspec.errors import ModelError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.ir.roles import KVKind
from ovspec.ir.specialize import (
    HOLD_FOLDING_KEY,
    Phase,
    Specialization,
    hold_weight_lookups,
    prepare,
    read_ir,
    serving_spec,
)
from ovspec.ladder import Ladder
from ovspec.runtime.kv import CopyAndGrowKV, SharedMaxKV
from ovspec.runtime.session import DecodeSession

LADDER = Ladder((32, 64, 128))


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_roles_found_from_the_graph(fixture_dir: Path) -> None:
    llm = load_llm(fixture_dir)
    roles = llm.roles
    assert (roles.input_ids, roles.attention_mask, roles.position_ids, roles.logits) == (
        "input_ids",
        "attention_mask",
        "position_ids",
        "logits",
    )
    assert [(r.layer, r.kind) for r in roles.kv] == [
        (0, KVKind.KEY),
        (0, KVKind.VALUE),
        (1, KVKind.KEY),
        (1, KVKind.VALUE),
    ]
    for role in roles.kv:
        assert role.seq_axis == 2
        assert role.shape(1, 32) == [1, 2, 32, 16]
        assert role.past_input == f"past_key_values.{role.layer}.{role.kind.value}"
    # 2 layers x (K + V) x 2 heads x 16 dims x 4 bytes
    assert roles.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4


def test_specialized_shapes_are_static(qwen2_dir: Path) -> None:
    llm = load_llm(qwen2_dir)
    decode = llm.specialize(Specialization.decode(64))
    shapes = {i.get_any_name(): list(i.get_shape()) for i in decode.inputs}
    assert shapes["input_ids"] == [1, 1]
    assert shapes["attention_mask"] == [1, 65]
    assert shapes["past_key_values.0.key"] == [1, 2, 64, 16]
    outs = {o.get_any_name(): list(o.get_shape()) for o in decode.outputs}
    assert outs["present.0.value"] == [1, 2, 1, 16]  # the new token only
    prefill = llm.specialize(Specialization.prefill(64, 16))
    shapes = {i.get_any_name(): list(i.get_shape()) for i in prefill.inputs}
    assert shapes["input_ids"] == [1, 16] and shapes["attention_mask"] == [1, 80]
    assert not decode.is_dynamic() and not prefill.is_dynamic()
    # The dynamic source is untouched by specializing.
    assert llm.model.is_dynamic()


def test_specializing_skips_smart_reshape(
    fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shapes are set and inferred directly: ``Model.reshape`` (whose SmartReshape passes
    were ~90% of a specialization's time) is not called for an IR that infers."""
    llm = load_llm(fixture_dir)

    def refuse(*_: object) -> None:
        raise AssertionError("Model.reshape called")

    monkeypatch.setattr(ov.Model, "reshape", refuse)
    decode = llm.specialize(Specialization.decode(64))
    assert not decode.is_dynamic()
    assert list(decode.input("attention_mask").get_shape()) == [1, 65]


def test_specializing_falls_back_to_model_reshape(
    qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where shape inference alone fails, ``Model.reshape`` (with SmartReshape) runs, and
    its graph is the static one asked for."""
    import ovspec.ir.specialize as specialize

    llm = load_llm(qwen2_dir)
    calls: list[object] = []
    reshape = ov.Model.reshape

    def counted(model: ov.Model, *args: object) -> None:
        calls.append(args)
        reshape(model, *args)

    def fail_after_setting(model: ov.Model, shapes: dict[str, ov.PartialShape]) -> bool:
        for parameter in model.get_parameters():
            parameter.set_partial_shape(
                ov.PartialShape([7] * parameter.get_partial_shape().rank.get_length())
            )
        return False

    monkeypatch.setattr(specialize, "_set_input_shapes", fail_after_setting)
    monkeypatch.setattr(ov.Model, "reshape", counted)
    decode = llm.specialize(Specialization.decode(64))
    assert len(calls) == 1
    assert list(decode.input("past_key_values.0.key").get_shape()) == [1, 2, 64, 16]
    assert list(decode.input("input_ids").get_shape()) == [1, 1]


@pytest.mark.parametrize("layout", ["copy-and-grow", "shared-max"])
def test_reference_run_reproduced_across_boundaries(fixture_dir: Path, layout: str) -> None:
    """The shipped greedy reference (64 steps) through rungs 32 -> 64 -> 128."""
    ref = np.load(fixture_dir / "reference.npz")
    llm = load_llm(fixture_dir)
    kv = (
        CopyAndGrowKV(llm.roles, 32)
        if layout == "copy-and-grow"
        else SharedMaxKV(llm.roles, 32, 128)
    )
    session = DecodeSession(llm.roles, LADDER, kv, DirectPrograms(llm), prefill_chunk_tokens=8)
    rows = [session.prefill([int(t) for t in ref["prompt_ids"]])]
    rows += [session.step(int(t)) for t in ref["generated_ids"][:-1]]
    logits = np.stack(rows)
    assert [(b.at_live_tokens, b.migration.to_capacity_tokens) for b in session.boundaries] == [
        (32, 64),
        (64, 128),
    ]
    np.testing.assert_array_equal(logits.argmax(-1), ref["step_logits"].argmax(-1))
    assert cosine_rows(logits, ref["step_logits"]).min() >= 0.99999
    session.close()


def test_random_prompts_match_the_stateful_model(fixture_dir: Path) -> None:
    """Random prompts and forced tokens, prompt lengths that straddle rungs and chunks."""
    rng = np.random.default_rng(7)
    llm = load_llm(fixture_dir)
    model = read_ir(fixture_dir / "openvino_model.xml")
    control = StatefulRunner(model, "CPU", EXACT_CPU_PROPERTIES)
    programs = DirectPrograms(llm)
    for prompt_len in (5, 32, 45):
        prompt = rng.integers(3, 2048, prompt_len).tolist()
        forced = rng.integers(3, 2048, 70).tolist()
        expected = control.teacher_forced(prompt, forced)
        session = DecodeSession(llm.roles, LADDER, CopyAndGrowKV(llm.roles, 32), programs, 16)
        got = np.stack([session.prefill(prompt)] + [session.step(t) for t in forced])
        assert session.boundaries, "the run must cross at least one rung boundary"
        np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
        assert cosine_rows(got, expected).min() >= 0.99999
        session.close()


def test_stateless_ir_is_accepted(tmp_path: Path, qwen2_dir: Path) -> None:
    """A stateless export (past_* inputs, present_* outputs) specializes the same way."""
    from openvino._offline_transformations import stateful_to_stateless_transformation

    model = read_ir(qwen2_dir / "openvino_model.xml")
    stateful_to_stateless_transformation(model)
    ov.save_model(model, tmp_path / "openvino_model.xml", compress_to_fp16=False)
    llm = prepare(read_ir(tmp_path / "openvino_model.xml"))
    assert len(llm.roles.kv) == 4
    assert Phase.DECODE is Specialization.decode(32).phase


def test_ir_without_kv_cache_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no KV cache"):
        prepare(no_kv_graph())


def test_specialization_validation() -> None:
    with pytest.raises(ModelError):
        Specialization(Phase.DECODE, 32, 4)
    with pytest.raises(ModelError, match="chunk"):
        Specialization.prefill(32, 64)
    with pytest.raises(ModelError):
        Specialization.decode(0)
    assert Specialization.prefill(64, 16).label == "prefill@64x16"
    assert Specialization.decode(64).canonical != Specialization.prefill(64, 1).canonical


def test_roles_survive_their_json_record(fixture_dir: Path) -> None:
    import json

    from ovspec.ir.roles import ModelRoles

    roles = load_llm(fixture_dir).roles
    assert ModelRoles.from_json(json.loads(json.dumps(roles.to_json()))) == roles
    for broken in ({}, {"kv": []}, {**roles.to_json(), "kv": [{"layer": "x"}]}, "text"):
        with pytest.raises(ValueError, match="malformed roles record"):
            ModelRoles.from_json(broken)


def test_a_shared_rung_decodes_on_its_prefill_graph_and_others_on_their_own() -> None:
    decode = Specialization.decode(64)
    assert serving_spec(decode, 16, 64) == Specialization.prefill(64, 16)
    assert serving_spec(Specialization.decode(8), 16, 8) == (
        Specialization.prefill(8, 8)  # the chunk shrinks to a small rung
    )
    assert serving_spec(decode, 16, 32) == decode  # a static graph of its own
    assert serving_spec(decode, None, 64) == decode  # no 1..P graph
    prefill = Specialization.prefill(64, 16)
    assert serving_spec(prefill, 16, None) == prefill


def test_weight_lookups_are_held_out_of_constant_folding(tiny_dir: Path) -> None:
    """The embedding Gather of an f16 table carries the key, through a specialization's
    clone (a Gather by constant indices does not: it may fold); and this OpenVINO's
    ConstantFolding honours the key (a canary: a renamed key fails here)."""
    llm = load_llm(tiny_dir)
    model = llm.specialize(Specialization.decode(32))
    held = [op for op in model.get_ordered_ops() if HOLD_FOLDING_KEY in op.get_rt_info()]
    assert [op.get_type_name() for op in held] == ["Gather"]
    table = ov.opset13.constant(np.ones((4, 3), dtype=np.float16))
    indices = ov.opset13.constant(np.array([1, 2], dtype=np.int64))
    folded = []
    for hold in (False, True):
        gather = ov.opset13.gather(ov.opset13.convert(table, ov.Type.f32), indices, 0)
        probe = ov.Model([gather], [])
        assert hold_weight_lookups(probe) == 0  # constant indices
        if hold:
            gather.get_rt_info()[HOLD_FOLDING_KEY] = ""
        manager = Manager()
        manager.register_pass(ConstantFolding())
        manager.run_passes(probe)
        kinds = {op.get_type_name() for op in probe.get_ordered_ops()}
        folded.append(kinds == {"Constant", "Result"})
    assert folded == [True, False]
