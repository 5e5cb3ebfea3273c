"""Tests of ovspec.builtin.qwen2: the synthetic Qwen2 IR has the export's interface and
structure, and computes what a numpy Qwen2 reference computes from the same weights."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import openvino as ov
import pytest

from ovspec.builtin.presets import (
    PRESETS,
    ModelSpec,
    generate_weight,
    generate_weights,
    rope_inv_freq,
)
from ovspec.builtin.qwen2 import MASK_FILL_VALUE, MODEL_XML, build_model, write_model
from ovspec.errors import BadRequestError, ModelError

TINY = PRESETS["tiny"]

# Compile properties for an exact comparison on CPU (DESIGN.md §9): the defaults use a
# u8/f16 KV cache and dynamic quantization.
EXACT_CPU = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
}

# Facts read off the real optimum-intel 2.2.0 Qwen2 export (2 layers, 4/2 heads, head 16,
# vocab 2048) that ovspec's fixtures hold; hard-coded so tests read nothing outside.
FIXTURE_INPUTS = [
    ("input_ids", "[?,?]", "i64"),
    ("attention_mask", "[?,?]", "i64"),
    ("position_ids", "[?,?]", "i64"),
    ("beam_idx", "[?]", "i32"),
]
FIXTURE_OUTPUT = ("logits", "[?,?,2048]", "f32")
FIXTURE_VARIABLES = {
    "past_key_values.0.keypresent.0.key",
    "past_key_values.0.valuepresent.0.value",
    "past_key_values.1.keypresent.1.key",
    "past_key_values.1.valuepresent.1.value",
}
FIXTURE_VARIABLE_SHAPE = "[?,2,?,16]"
FIXTURE_SDPA_INPUTS = 5
FIXTURE_RUNTIME_OPTIONS = {"KV_CACHE_PRECISION": "f16", "ACTIVATIONS_SCALE_FACTOR": "8.0"}
VARIABLE_ID = re.compile(r"past_key_values\.(\d+)\.(key|value)present\.\1\.\2")


@pytest.fixture(scope="module")
def tiny_model() -> ov.Model:
    return build_model(TINY)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(TINY, tmp_path_factory.mktemp("synthetic") / "tiny")


def _ops(model: ov.Model, type_name: str) -> list[Any]:
    return [op for op in model.get_ordered_ops() if op.get_type_name() == type_name]


def _source(node: Any, port: int) -> Any:
    return node.input_value(port).get_node()


# --------------------------------------------------------------------------- spec


def test_presets_are_valid_and_qwen25_05b_has_its_parameter_count() -> None:
    assert {"tiny", "small", "qwen2.5-0.5b"} <= set(PRESETS)
    assert TINY.head_dim == 16
    qwen = PRESETS["qwen2.5-0.5b"]
    assert qwen.head_dim == 64
    # Qwen/Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings counted once).
    assert qwen.parameter_count == 494_032_768


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"attention_heads": 3}, "hidden_size 64 is not a multiple of attention_heads 3"),
        ({"kv_heads": 3}, "not a multiple of kv_heads 3"),
        ({"layers": 0}, "layers 0 is not an integer >= 1"),
        ({"layers": True}, "layers True is not an integer"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"eos_token_id": 2048}, "outside the vocabulary"),
        ({"hidden_size": 36, "attention_heads": 4, "kv_heads": 4}, "head_dim 9"),
    ],
)
def test_spec_rejects_bad_shapes(change: dict[str, Any], words: str) -> None:
    fields = {**TINY.to_json(), **change}
    with pytest.raises(BadRequestError, match=re.escape(words)):
        ModelSpec(**fields)


def test_weights_are_f16_seeded_and_independent_of_draw_order() -> None:
    name = "model.layers.1.mlp.up_proj.weight"
    first = generate_weight(TINY, name)
    assert first.dtype == np.float16
    assert first.shape == (TINY.intermediate_size, TINY.hidden_size)
    np.testing.assert_array_equal(first, generate_weights(TINY)[name])
    other_seed = ModelSpec(**{**TINY.to_json(), "seed": 1})
    assert not np.array_equal(first, generate_weight(other_seed, name))
    with pytest.raises(BadRequestError):
        generate_weight(TINY, "lm_head.bias")


# --------------------------------------------------------------------------- interface


def test_interface_matches_the_export(tiny_model: ov.Model) -> None:
    inputs = [
        (p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name())
        for p in tiny_model.inputs
    ]
    assert inputs == FIXTURE_INPUTS
    assert [p.get_names() for p in tiny_model.inputs] == [{n} for n, _, _ in FIXTURE_INPUTS]
    (out,) = tiny_model.outputs
    assert out.get_names() == {FIXTURE_OUTPUT[0]}
    assert (str(out.get_partial_shape()), out.get_element_type().get_type_name()) == (
        FIXTURE_OUTPUT[1:]
    )
    variables = {v.get_info().variable_id: v.get_info() for v in tiny_model.get_variables()}
    assert set(variables) == FIXTURE_VARIABLES
    assert all(VARIABLE_ID.fullmatch(v) for v in variables)
    for info in variables.values():
        assert str(info.data_shape) == FIXTURE_VARIABLE_SHAPE
        assert info.data_type == ov.Type.f32
    for key, value in FIXTURE_RUNTIME_OPTIONS.items():
        assert tiny_model.get_rt_info(["runtime_options", key]).astype(str) == value


def test_kv_chain_is_readvalue_gather_concat_assign_into_sdpa(tiny_model: ov.Model) -> None:
    beam_idx = tiny_model.inputs[3].get_node()
    assigns = {a.get_variable_id(): a for a in _ops(tiny_model, "Assign")}
    assert set(assigns) == FIXTURE_VARIABLES
    sdpas = _ops(tiny_model, "ScaledDotProductAttention")
    assert len(sdpas) == TINY.layers
    assert {s.get_input_size() for s in sdpas} == {FIXTURE_SDPA_INPUTS}
    for variable_id, assign in assigns.items():
        concat = _source(assign, 0)
        assert concat.get_type_name() == "Concat"
        assert concat.get_axis() in (2, -2)
        gather = _source(concat, 0)
        assert gather.get_type_name() == "Gather"
        assert _source(gather, 1).get_friendly_name() == beam_idx.get_friendly_name()
        read = _source(gather, 0)
        assert read.get_type_name() == "ReadValue"
        assert read.get_variable_id() == variable_id
        # Concat -> GQA repeat (Unsqueeze -> Broadcast -> Reshape) -> SDPA input 1 or 2.
        (unsqueeze,) = [
            t.get_node()
            for t in concat.output(0).get_target_inputs()
            if t.get_node().get_type_name() == "Unsqueeze"
        ]
        (broadcast,) = [t.get_node() for t in unsqueeze.output(0).get_target_inputs()]
        (reshape,) = [t.get_node() for t in broadcast.output(0).get_target_inputs()]
        assert (broadcast.get_type_name(), reshape.get_type_name()) == ("Broadcast", "Reshape")
        port = 1 if ".key" in variable_id else 2
        assert {
            (t.get_node().get_type_name(), t.get_index())
            for t in reshape.output(0).get_target_inputs()
        } == {("ScaledDotProductAttention", port)}
    for sdpa in sdpas:
        assert sdpa.input_value(3).get_element_type() == ov.Type.f32  # explicit float mask
        assert sdpa.input_value(4).get_partial_shape().rank.get_length() == 0  # scale


def test_weights_are_f16_constants_with_marked_decompression(tiny_model: ov.Model) -> None:
    matmuls = _ops(tiny_model, "MatMul")
    linears = [_source(m, 1) for m in matmuls if "aten::linear" in m.get_friendly_name()]
    assert len(linears) == 7 * TINY.layers + 1  # q, k, v, o, gate, up, down; lm_head
    (rope,) = [_source(m, 0) for m in matmuls if "rotary_emb" in m.get_friendly_name()]
    (embedding,) = [
        _source(g, 0) for g in _ops(tiny_model, "Gather") if "embed" in g.get_friendly_name()
    ]
    biases = [
        _source(a, 1) for a in _ops(tiny_model, "Add") if "aten::linear" in a.get_friendly_name()
    ]
    assert len(biases) == 3 * TINY.layers  # Qwen2's q, k, v biases
    for convert in [*linears, rope, embedding, *biases]:
        assert convert.get_type_name() == "Convert"
        assert convert.get_output_element_type(0) == ov.Type.f32
        assert any(key.startswith("decompression") for key in convert.get_rt_info())
        assert _source(convert, 0).get_element_type() == ov.Type.f16
    # Like compress_to_fp16 exports: only the norms' eps stay f32 among float constants.
    f32_constants = [c for c in _ops(tiny_model, "Constant") if c.get_element_type() == ov.Type.f32]
    assert len(f32_constants) == 2 * TINY.layers + 1
    assert all(c.get_data().size == 1 for c in f32_constants)


def test_cpu_keeps_the_weights_f16(tiny_model: ov.Model) -> None:
    # An unmarked f16->f32 Convert is constant-folded at compile time into f32 weights
    # (a blob twice the size); the decompression mark keeps them f16 in the plugin.
    compiled = ov.Core().compile_model(tiny_model, "CPU", EXACT_CPU)
    weight_types = [
        op.input_value(1).get_element_type()
        for op in compiled.get_runtime_model().get_ordered_ops()
        if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
    ]
    assert len(weight_types) == 7 * TINY.layers + 1
    assert set(weight_types) == {ov.Type.f16}


def test_ir_stores_exactly_the_generated_f16_weights(tiny_model: ov.Model) -> None:
    # The builder lets OpenVINO round f32 draws to f16; the reference rounds with numpy.
    stored = {
        c.get_friendly_name().removeprefix("self.").removesuffix("_compressed"): c
        for c in _ops(tiny_model, "Constant")
        if c.get_friendly_name().startswith("self.")
    }
    weights = generate_weights(TINY)
    assert set(stored) == set(weights)
    for name, values in weights.items():
        data = stored[name].get_data()
        assert data.dtype == np.float16
        np.testing.assert_array_equal(
            data.reshape(values.shape).view(np.uint16), values.view(np.uint16)
        )


def test_stateless_form_has_the_exports_names(tiny_model: ov.Model) -> None:
    from openvino._offline_transformations import stateful_to_stateless_transformation

    model = tiny_model.clone()
    stateful_to_stateless_transformation(model)
    kv = [f"{i}.{kind}" for i in range(TINY.layers) for kind in ("key", "value")]
    assert [p.get_any_name() for p in model.inputs] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *(f"past_key_values.{name}" for name in kv),
    ]
    assert [r.get_any_name() for r in model.outputs] == ["logits", *(f"present.{n}" for n in kv)]


def test_written_model_reads_back_with_the_marks(tiny_dir: Path) -> None:
    assert {p.name for p in tiny_dir.iterdir()} == {
        MODEL_XML,
        "openvino_model.bin",
        "config.json",
        "generation_config.json",
    }
    model = ov.Core().read_model(tiny_dir / MODEL_XML)
    assert {v.get_info().variable_id for v in model.get_variables()} == FIXTURE_VARIABLES
    converts = [
        c for c in _ops(model, "Convert") if _source(c, 0).get_element_type() == ov.Type.f16
    ]
    assert converts and all(
        any(k.startswith("decompression") for k in c.get_rt_info()) for c in converts
    )
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["model_type"] == "qwen2"
    assert (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["vocab_size"],
        config["max_position_embeddings"],
        config["tie_word_embeddings"],
    ) == (64, 128, 2, 4, 2, 2048, 8192, False)
    assert config["rope_theta"] == TINY.rope_theta
    assert config["rms_norm_eps"] == TINY.rms_norm_eps
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 0)


def test_write_refuses_a_non_empty_folder_and_leaves_no_staging(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="not an empty folder"):
        write_model(TINY, target)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert (target / "keep.txt").read_text() == "mine"


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_dir: Path, tmp_path: Path) -> None:
    again = write_model(TINY, tmp_path / "again")
    other = write_model(ModelSpec(**{**TINY.to_json(), "seed": 7}), tmp_path / "other")
    bin_bytes = (tiny_dir / "openvino_model.bin").read_bytes()
    assert (again / "openvino_model.bin").read_bytes() == bin_bytes
    other_bytes = (other / "openvino_model.bin").read_bytes()
    assert len(other_bytes) == len(bin_bytes)
    assert other_bytes != bin_bytes


def test_tied_embeddings_share_one_weight() -> None:
    spec = ModelSpec(**{**TINY.to_json(), "tie_word_embeddings": True})
    model = build_model(spec)
    lm_head = next(m for m in _ops(model, "MatMul") if "lm_head" in m.get_friendly_name())
    embed = next(g for g in _ops(model, "Gather") if "embed_tokens" in g.get_friendly_name())
    assert _source(lm_head, 1) is not None
    assert _source(lm_head, 1).get_friendly_name() == _source(embed, 0).get_friendly_name()


# --------------------------------------------------------------------------- numerics


F64 = npt.NDArray[np.float64]


def reference_logits(spec: ModelSpec, ids: npt.NDArray[np.int64]) -> F64:
    """Logits [S, vocab] of transformers' Qwen2 forward for one sequence, in float64,
    from the f16 weights the IR stores (and its f16-stored RoPE frequencies and scale)."""
    w = {k: v.astype(np.float64) for k, v in generate_weights(spec).items()}
    seq, heads, kv_heads, hd = len(ids), spec.attention_heads, spec.kv_heads, spec.head_dim
    groups = heads // kv_heads

    def norm(x: F64, weight: str) -> F64:
        out: F64 = w[weight] * (
            x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + spec.rms_norm_eps)
        )
        return out

    def linear(x: F64, prefix: str, n_heads: int) -> F64:
        """Biased projection, split into heads: [n_heads, S, hd]."""
        out = x @ w[prefix + ".weight"].T + w[prefix + ".bias"]
        heads_first: F64 = out.reshape(seq, n_heads, hd).transpose(1, 0, 2)
        return heads_first

    inv_freq = rope_inv_freq(spec).astype(np.float16).astype(np.float64)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(angles), np.sin(angles)

    def rope(x: F64) -> F64:
        rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], axis=-1)
        out: F64 = x * cos + rotated * sin
        return out

    scale = float(np.float16(1.0 / np.sqrt(hd)))
    future = np.triu(np.ones((seq, seq), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        h = norm(x, p + "input_layernorm.weight")
        q = rope(linear(h, p + "self_attn.q_proj", heads))
        # repeat_kv: query head j reads KV head j // groups.
        k = np.repeat(rope(linear(h, p + "self_attn.k_proj", kv_heads)), groups, axis=0)
        v = np.repeat(linear(h, p + "self_attn.v_proj", kv_heads), groups, axis=0)
        scores = q @ k.transpose(0, 2, 1) * scale + np.where(future, MASK_FILL_VALUE, 0.0)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(seq, heads * hd)
        x = x + context @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, p + "post_attention_layernorm.weight")
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    lm_head = w["model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"]
    logits: F64 = norm(x, "model.norm.weight") @ lm_head.T
    return logits


def _feed(request: ov.InferRequest, chunk: npt.NDArray[np.int64], done: int) -> Any:
    """Run the next ``chunk`` of one sequence (``done`` tokens already in the state)."""
    n = len(chunk)
    request.infer(
        {
            "input_ids": chunk[None, :],
            "attention_mask": np.ones((1, done + n), np.int64),
            "position_ids": np.arange(done, done + n, dtype=np.int64)[None, :],
            "beam_idx": np.zeros(1, np.int32),
        }
    )
    return request.get_tensor("logits").data[0].copy()


@pytest.mark.parametrize(
    "change",
    [{}, {"tie_word_embeddings": True}, {"kv_heads": 4}, {"kv_heads": 1, "seed": 3}],
    ids=["gqa", "tied", "mha", "mqa"],
)
def test_prefill_then_decode_matches_numpy_reference(change: dict[str, Any]) -> None:
    spec = ModelSpec(**{**TINY.to_json(), **change})
    compiled = ov.Core().compile_model(build_model(spec), "CPU", EXACT_CPU)
    ids = np.array([17, 345, 78, 912, 23, 456, 789, 101], np.int64)
    # A 5-token prefill, then three decode steps through the state.
    request = compiled.create_infer_request()
    got = np.concatenate(
        [_feed(request, ids[:5], 0)] + [_feed(request, ids[t : t + 1], t) for t in (5, 6, 7)]
    )
    want = reference_logits(spec, ids)
    assert got.shape == want.shape == (len(ids), spec.vocab_size)
    # f32 compute on both sides from identical f16 weights: only round-off differs.
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert want.std() > 1.0  # logits are not vanishingly small


def test_greedy_run_keeps_a_top1_margin_far_above_round_off() -> None:
    """What lets a static rung be compared with the dynamic model token by token: along a
    greedy run the top-1/top-2 gap stays far above the f32 round-off of the logits."""
    compiled = ov.Core().compile_model(build_model(TINY), "CPU", EXACT_CPU)
    prompt = np.array([17, 345, 78, 912, 23, 456, 789, 101], np.int64)
    request = compiled.create_infer_request()
    ids = list(prompt)
    steps = [_feed(request, prompt, 0)[-1]]
    while len(steps) < 32:
        ids.append(int(steps[-1].argmax()))
        steps.append(_feed(request, np.array(ids[-1:], np.int64), len(ids) - 1)[-1])
    got = np.array(steps)
    want = reference_logits(TINY, np.array(ids, np.int64))[len(prompt) - 1 :]
    error = np.abs(got - want).max()
    assert error <= 1e-4 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    top2 = np.sort(want, axis=-1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 100 * error


def test_padding_and_beam_reorder_follow_the_reference() -> None:
    """Batch of two, the second left-padded; then a decode step with the beams swapped."""
    compiled = ov.Core().compile_model(build_model(TINY), "CPU", EXACT_CPU)
    request = compiled.create_infer_request()
    a = np.array([5, 6, 7, 8, 9], np.int64)
    b = np.array([40, 41, 42], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)
    request.infer(
        {
            "input_ids": np.stack([a, np.concatenate([[0, 0], b])]),
            "attention_mask": mask,
            "position_ids": np.array([[0, 1, 2, 3, 4], [1, 1, 0, 1, 2]], np.int64),
            "beam_idx": np.arange(2, dtype=np.int32),
        }
    )
    prefill = request.get_tensor("logits").data.copy()
    ref_a, ref_b = reference_logits(TINY, a), reference_logits(TINY, b)
    tol = 1e-4 * max(np.abs(ref_a).max(), np.abs(ref_b).max())
    assert np.abs(prefill[0] - ref_a).max() <= tol
    assert np.abs(prefill[1, 2:] - ref_b).max() <= tol
    # beam_idx [1, 0] swaps the caches: row 0 now continues b, row 1 continues a.
    request.infer(
        {
            "input_ids": np.array([[43], [10]], np.int64),
            "attention_mask": np.concatenate([mask[::-1], np.ones((2, 1), np.int64)], axis=1),
            "position_ids": np.array([[3], [5]], np.int64),
            "beam_idx": np.array([1, 0], np.int32),
        }
    )
    step = request.get_tensor("logits").data[:, 0].copy()
    assert np.abs(step[0] - reference_logits(TINY, np.append(b, 43))[-1]).max() <= tol
    assert np.abs(step[1] - reference_logits(TINY, np.append(a, 10))[-1]).max() <= tol
