"""Synthetic Qwen2 models, so ovspec runs and tests without downloading one.

Owns ``ModelSpec`` and its ``PRESETS``, the seeded weights, and a builder that writes the
stateful IR ``optimum-cli export openvino --task text-generation-with-past`` writes for
Qwen2 (fp16-compressed weights), next to ``config.json`` and ``generation_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ovspec.errors import BadRequestError, ModelError

if TYPE_CHECKING:
    import openvino as ov

F16Array = npt.NDArray[np.float16]
F32Array = npt.NDArray[np.float32]

MODEL_XML = "openvino_model.xml"

# What the IR's model rt_info carries under "runtime_options": optimum-intel 2.2 writes
# these two (seen in a real Qwen2 export), and the CPU plugin applies them unless a
# compile property overrides them, so a synthetic model must carry them too.
RUNTIME_OPTIONS: Mapping[str, str] = {
    "KV_CACHE_PRECISION": "f16",
    "ACTIVATIONS_SCALE_FACTOR": "8.0",
}

# Mask value for masked positions: transformers builds its float mask with the dtype's
# minimum, and the export keeps -65504 (f16 min) rather than -inf, so a fully masked
# row averages instead of turning into NaN.
MASK_FILL_VALUE = -65504.0

# Initial scales (stds of uniform draws). Projections get std 1/sqrt(fan_in) so activations
# keep unit scale; the embedding (and lm_head) std makes logits' std about LOGIT_STD, which
# keeps the top-1/top-2 logit gap far above f32 round-off: greedy decoding of the static
# and dynamic variants then picks the same tokens.
LOGIT_STD = 4.0
BIAS_STD = 0.1
NORM_WEIGHT_STD = 0.1


@dataclass(frozen=True)
class ModelSpec:
    """Shape and seed of a synthetic Qwen2 decoder. Sizes count elements, not bytes.

    ``head_dim`` is derived as in Qwen2 (``hidden_size // attention_heads``), so the
    written ``config.json`` describes the IR exactly.
    """

    layers: int
    hidden_size: int
    intermediate_size: int
    attention_heads: int
    kv_heads: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        positive = (
            "layers",
            "hidden_size",
            "intermediate_size",
            "attention_heads",
            "kv_heads",
            "vocab_size",
            "max_position_embeddings",
        )
        for name in positive:
            _require_int(name, getattr(self, name), minimum=1)
        _require_int("seed", self.seed, minimum=0)
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            _require_int(name, value, minimum=0)
            if value >= self.vocab_size:
                raise BadRequestError(
                    f"model spec {name} {value} is outside the vocabulary "
                    f"(vocab_size {self.vocab_size}); pick an id below it"
                )
        if not isinstance(self.tie_word_embeddings, bool):
            raise BadRequestError(
                f"model spec tie_word_embeddings {self.tie_word_embeddings!r} is not a bool"
            )
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadRequestError(f"model spec {name} {value!r} is not a number")
            if not math.isfinite(value) or value <= 0:
                raise BadRequestError(f"model spec {name} {value!r} must be finite and > 0")
        if self.hidden_size % self.attention_heads:
            raise BadRequestError(
                f"model spec hidden_size {self.hidden_size} is not a multiple of "
                f"attention_heads {self.attention_heads}; Qwen2 derives head_dim from them"
            )
        if self.attention_heads % self.kv_heads:
            raise BadRequestError(
                f"model spec attention_heads {self.attention_heads} is not a multiple of "
                f"kv_heads {self.kv_heads}; grouped-query attention needs whole groups"
            )
        if self.head_dim % 2:
            raise BadRequestError(
                f"model spec head_dim {self.head_dim} (hidden_size / attention_heads) is odd; "
                "rotary embeddings rotate pairs, choose an even head size"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @property
    def parameter_count(self) -> int:
        """Number of weight elements the IR stores (a tied lm_head is counted once)."""
        return sum(math.prod(draw.shape) for draw in _weight_layout(self).values())

    @property
    def kv_bytes_per_token(self) -> int:
        """f32 KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 4

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequestError(f"model spec {name} {value!r} is not an integer >= {minimum}")


PRESETS: Mapping[str, ModelSpec] = {
    # The same shape as the real optimum-intel Qwen2 export ovspec's fixtures came from.
    "tiny": ModelSpec(
        layers=2,
        hidden_size=64,
        intermediate_size=128,
        attention_heads=4,
        kv_heads=2,
        vocab_size=2048,
        max_position_embeddings=8192,
        rope_theta=10_000.0,
    ),
    # Large enough for per-rung compile and decode times to mean something (0.2-0.4 s).
    "small": ModelSpec(
        layers=6,
        hidden_size=256,
        intermediate_size=1024,
        attention_heads=4,
        kv_heads=2,
        vocab_size=8192,
        max_position_embeddings=32768,
    ),
    # Long-context decode in miniature: full multi-head KV (8 KV heads) on few weights,
    # so at 2K tokens the KV cache (34 MB) outweighs the weights (29 MB) and decode
    # time follows the rung's capacity. The bench's default model.
    "kv-heavy": ModelSpec(
        layers=4,
        hidden_size=512,
        intermediate_size=1024,
        attention_heads=8,
        kv_heads=8,
        vocab_size=4096,
        max_position_embeddings=32768,
    ),
    # Qwen2.5-0.5B's shapes (config.json of Qwen/Qwen2.5-0.5B), random weights.
    "qwen2.5-0.5b": ModelSpec(
        layers=24,
        hidden_size=896,
        intermediate_size=4864,
        attention_heads=14,
        kv_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151643,
    ),
}


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class _Draw:
    """How one weight is drawn: its shape (HF layout) and the mean and std of its values."""

    shape: tuple[int, ...]
    mean: float
    std: float


def _weight_layout(spec: ModelSpec) -> dict[str, _Draw]:
    """HF parameter name -> how to draw it, for every weight the IR stores."""
    d, hd = spec.hidden_size, spec.head_dim
    q_out, kv_out = spec.attention_heads * hd, spec.kv_heads * hd
    inter = spec.intermediate_size

    def proj(out_features: int, in_features: int) -> _Draw:
        return _Draw((out_features, in_features), 0.0, 1.0 / math.sqrt(in_features))

    def bias(features: int) -> _Draw:
        return _Draw((features,), 0.0, BIAS_STD)

    norm = _Draw((d,), 1.0, NORM_WEIGHT_STD)
    vocab = _Draw((spec.vocab_size, d), 0.0, LOGIT_STD / math.sqrt(d))
    layout = {"model.embed_tokens.weight": vocab}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        layout[p + "input_layernorm.weight"] = norm
        layout[p + "self_attn.q_proj.weight"] = proj(q_out, d)
        layout[p + "self_attn.q_proj.bias"] = bias(q_out)
        layout[p + "self_attn.k_proj.weight"] = proj(kv_out, d)
        layout[p + "self_attn.k_proj.bias"] = bias(kv_out)
        layout[p + "self_attn.v_proj.weight"] = proj(kv_out, d)
        layout[p + "self_attn.v_proj.bias"] = bias(kv_out)
        layout[p + "self_attn.o_proj.weight"] = proj(d, q_out)
        layout[p + "post_attention_layernorm.weight"] = norm
        layout[p + "mlp.gate_proj.weight"] = proj(inter, d)
        layout[p + "mlp.up_proj.weight"] = proj(inter, d)
        layout[p + "mlp.down_proj.weight"] = proj(d, inter)
    layout["model.norm.weight"] = norm
    if not spec.tie_word_embeddings:
        layout["lm_head.weight"] = vocab
    return layout


def weight_names(spec: ModelSpec) -> list[str]:
    """HF names of the weights ``generate_weight`` can draw (no ``lm_head`` when tied)."""
    return list(_weight_layout(spec))


def generate_weight(spec: ModelSpec, name: str) -> F16Array:
    """Draw one weight, as the f16 values the IR stores.

    Each weight has its own random stream keyed by (seed, name), so a weight does not
    depend on which others were drawn first and the builder can draw them one at a time.
    """
    return _draw_weight(spec, name).astype(np.float16)


def _draw_weight(spec: ModelSpec, name: str) -> F32Array:
    # f32 before rounding to f16: the builder hands this to OpenVINO's fp16 compression,
    # which rounds exactly as numpy's astype(float16) does (a test checks it).
    layout = _weight_layout(spec)
    if name not in layout:
        raise BadRequestError(f"no weight named {name!r} in this model spec; see weight_names()")
    draw = layout[name]
    stream = np.random.SeedSequence([spec.seed, zlib.crc32(name.encode("utf-8"))])
    # Uniform with the given std (half-width std*sqrt(3)), like torch.nn.Linear's default
    # init: a normal draw is ~10x slower, which is most of writing the 0.5B preset.
    values = np.random.default_rng(stream).random(draw.shape, dtype=np.float32)
    values -= np.float32(0.5)
    values *= np.float32(2.0 * math.sqrt(3.0) * draw.std)
    values += np.float32(draw.mean)
    return values


def generate_weights(spec: ModelSpec) -> dict[str, F16Array]:
    """All weights by HF name (holds them all: for references and tests, not big presets)."""
    return {name: generate_weight(spec, name) for name in weight_names(spec)}


def rope_inv_freq(spec: ModelSpec) -> F32Array:
    """RoPE inverse frequencies ``theta ** (-2i / head_dim)``, f32 as transformers computes them.

    The IR stores them f16-compressed, as ``compress_to_fp16`` exports do.
    """
    exponents = np.arange(0, spec.head_dim, 2, dtype=np.int64).astype(np.float32) / spec.head_dim
    return (1.0 / (spec.rope_theta**exponents)).astype(np.float32)


# --------------------------------------------------------------------------- graph


class _Qwen2Graph:
    """Builds the graph op by op, mirroring what optimum-intel's Qwen2 export contains."""

    def __init__(self, spec: ModelSpec) -> None:
        import openvino as ov
        import openvino.opset16 as ops
        from openvino._offline_transformations import compress_model_transformation
        from openvino.op.util import Variable, VariableInfo
        from openvino.utils.node_factory import NodeFactory

        self.ov = ov
        self.ops = ops
        self._compress = compress_model_transformation
        self._variable = Variable
        self._variable_info = VariableInfo
        self._opset4 = NodeFactory("opset4")
        self.spec = spec
        self._scalars: dict[tuple[str, float], ov.Output] = {}

    # ----- constants

    def int_const(self, values: Any, dtype: type = np.int64) -> Any:
        return self.ops.constant(np.array(values, dtype=dtype))

    def compressed(self, values: npt.NDArray[Any], name: str | None = None) -> Any:
        """An f16 Constant followed by a Convert to f32 marked as decompression.

        The mark (rt_info ``decompression``) is what keeps CPU/NPU plugins from folding the
        Convert into an f32 copy of the weight; Python cannot set it, so OpenVINO's own
        fp16 compression pass (the one ``save_model(compress_to_fp16=True)`` runs) is applied
        to a one-constant model and its output is spliced into the graph.
        """
        # asarray shares contiguous f32 input and keeps 0-d arrays 0-d (ascontiguousarray
        # would make them 1-d: the export's scalars are rank 0).
        as_f32 = np.asarray(values, dtype=np.float32, order="C")
        const = self.ops.constant(as_f32, name=name, shared_memory=True)
        holder = self.ov.Model([self.ops.result(const)], [], "fp16_compression")
        self._compress(holder)
        decompressed = holder.get_results()[0].input_value(0)
        node = decompressed.get_node()
        source = node.input_value(0).get_node() if node.get_input_size() else None
        if (
            node.get_type_name() != "Convert"
            or source is None
            or source.get_element_type() != self.ov.Type.f16
        ):
            raise ModelError(
                f"OpenVINO did not fp16-compress constant {name!r} (got "
                f"{node.get_type_name()}); this OpenVINO version is not supported by "
                "ovspec.testing"
            )
        # ov.Model named the Convert's tensor after the holder's Result; drop that name.
        # The holder (and its Result) dies on return; the Convert lives on in the graph.
        decompressed.get_tensor().set_names(set())
        return decompressed

    def weight(self, name: str, shape: tuple[int, ...] | None = None) -> Any:
        values = _draw_weight(self.spec, name)
        if shape is not None:
            values = values.reshape(shape)
        return self.compressed(values, "self." + name)

    def f16_scalar(self, value: float, shape: tuple[int, ...] = ()) -> Any:
        """A float constant the fp16 export would compress (shared, like the export's)."""
        key = (repr(shape), value)
        if key not in self._scalars:
            array = np.full(shape, value, dtype=np.float32)
            self._scalars[key] = self.compressed(array)
        return self._scalars[key]

    # ----- building blocks

    def rms_norm(self, x: Any, weight_name: str, scope: str) -> Any:
        # transformers' Qwen2RMSNorm as the export decomposes it: x * 1/sqrt(mean(x^2)+eps) * w.
        # The eps stays f32: compress_to_fp16 keeps a Divide's eps uncompressed.
        ops = self.ops
        d = self.spec.hidden_size
        squared = ops.power(x, self.f16_scalar(2.0, (1, 1, 1)), name=f"{scope}/aten::pow/Power")
        mean = ops.reduce_mean(
            squared, self.int_const([-1]), True, name=f"{scope}/aten::mean/ReduceMean"
        )
        eps = ops.constant(np.full((1, 1, 1), self.spec.rms_norm_eps, np.float32))
        shifted = ops.add(mean, eps, name=f"{scope}/aten::add/Add")
        root = ops.sqrt(shifted, name=f"{scope}/aten::rsqrt/Sqrt")
        inverse = ops.divide(
            self.f16_scalar(1.0, (1, 1, 1)), root, name=f"{scope}/aten::rsqrt/Divide"
        )
        normed = ops.multiply(x, inverse, name=f"{scope}/aten::mul/Multiply")
        return ops.multiply(
            self.weight(weight_name, (1, 1, d)), normed, name=f"{scope}/aten::mul/Multiply_1"
        )

    def linear(self, x: Any, prefix: str, *, bias: bool) -> Any:
        scope = "__module." + prefix
        out = self.ops.matmul(
            x, self.weight(prefix + ".weight"), False, True, name=f"{scope}/aten::linear/MatMul"
        )
        if bias:
            out = self.ops.add(out, self.weight(prefix + ".bias"), name=f"{scope}/aten::linear/Add")
        return out

    def silu(self, x: Any, name: str) -> Any:
        # Swish with no beta input, as the export has it (ops.swish adds a beta of 1.0).
        node = self._opset4.create("Swish", [x.output(0)], {})
        node.set_friendly_name(name)
        return node

    def split_heads(self, x: Any, heads: int, scope: str, suffix: str) -> Any:
        """[B, S, heads*hd] -> [B, heads, S, hd]."""
        ops = self.ops
        shaped = ops.reshape(
            x,
            self.int_const([0, 0, heads, self.spec.head_dim]),
            True,
            name=f"{scope}/aten::view/Reshape{suffix}",
        )
        return ops.transpose(
            shaped, self.int_const([0, 2, 1, 3]), name=f"{scope}/aten::transpose/Transpose{suffix}"
        )

    def rotary(self, x: Any, cos: Any, sin: Any, scope: str, suffix: str) -> Any:
        """x*cos + rotate_half(x)*sin, with rotate_half as Slice/neg/Concat (RoPE fusion input)."""
        ops = self.ops
        half = self.spec.head_dim // 2
        one, axis = self.int_const([1]), self.int_const([3])
        upper = ops.slice(
            x,
            self.int_const([half]),
            self.int_const([np.iinfo(np.int64).max]),
            one,
            axis,
            name=f"{scope}/aten::slice/Slice{suffix}_hi",
        )
        minus_one = ops.convert(self.int_const(-1, np.int32), self.ov.Type.f32)
        negated = ops.multiply(upper, minus_one, name=f"{scope}/aten::neg/Multiply{suffix}")
        lower = ops.slice(
            x,
            self.int_const([0]),
            self.int_const([half]),
            one,
            axis,
            name=f"{scope}/aten::slice/Slice{suffix}_lo",
        )
        rotated = ops.concat([negated, lower], -1, name=f"{scope}/aten::cat/Concat{suffix}")
        return ops.add(
            ops.multiply(x, cos, name=f"{scope}/aten::mul/Multiply{suffix}_cos"),
            ops.multiply(rotated, sin, name=f"{scope}/aten::mul/Multiply{suffix}_sin"),
            name=f"{scope}/aten::add/Add{suffix}",
        )

    def past(self, layer: int, kind: str, batch: Any, beam_idx: Any) -> tuple[Any, Any]:
        """ReadValue (zeros [batch, kv_heads, 0, hd] at first) -> Gather(beam_idx); variable."""
        ops, spec = self.ops, self.spec
        info = self._variable_info()
        info.variable_id = f"past_key_values.{layer}.{kind}present.{layer}.{kind}"
        info.data_type = self.ov.Type.f32
        info.data_shape = self.ov.PartialShape([-1, spec.kv_heads, -1, spec.head_dim])
        variable = self._variable(info)
        empty_shape = ops.concat(
            [
                batch,
                self.int_const([spec.kv_heads]),
                self.int_const([0]),
                self.int_const([spec.head_dim]),
            ],
            0,
        )
        initial = ops.broadcast(self.f16_scalar(0.0), empty_shape)
        state = ops.read_value(initial, variable)
        # The export's ReadValue keeps the name of the past input MakeStateful replaced.
        state.output(0).get_tensor().set_names({f"past_key_values.{layer}.{kind}"})
        return ops.gather(state, beam_idx, self.int_const(0)), variable

    # ----- the model

    def build(self) -> ov.Model:
        ov, ops, spec = self.ov, self.ops, self.spec
        params = {}
        for name, rank, dtype in (
            ("input_ids", 2, ov.Type.i64),
            ("attention_mask", 2, ov.Type.i64),
            ("position_ids", 2, ov.Type.i64),
            ("beam_idx", 1, ov.Type.i32),
        ):
            param = ops.parameter(ov.PartialShape([-1] * rank), dtype, name=name)
            param.output(0).get_tensor().set_names({name})
            params[name] = param

        input_ids = params["input_ids"]
        batch = ops.gather(ops.shape_of(input_ids), self.int_const([0]), self.int_const(0))

        embed = self.weight("model.embed_tokens.weight")
        hidden = ops.gather(
            embed,
            ops.convert(
                input_ids, ov.Type.i32, name="__module.model.embed_tokens/aten::embedding/Convert"
            ),
            self.int_const(0),
            name="__module.model.embed_tokens/aten::embedding/Gather",
        )

        # Rotary tables from position_ids, shared by all layers: [B, 1, S, hd].
        # Like the export, the inverse frequencies are an f16-compressed constant too.
        scope = "__module.model.rotary_emb"
        inv_freq = self.compressed(
            rope_inv_freq(spec).reshape(1, -1, 1), f"{scope}/aten::to/Convert"
        )
        positions = ops.convert(
            ops.unsqueeze(params["position_ids"], self.int_const(1)),
            ov.Type.f32,
            name=f"{scope}/aten::to/Convert_3",
        )
        freqs = ops.transpose(
            ops.matmul(inv_freq, positions, False, False, name=f"{scope}/aten::matmul/MatMul"),
            self.int_const([0, 2, 1]),
        )
        angles = ops.concat([freqs, freqs], -1, name=f"{scope}/aten::cat/Concat")
        cos = ops.unsqueeze(ops.cos(angles, name=f"{scope}/aten::cos/Cos"), self.int_const(1))
        sin = ops.unsqueeze(ops.sin(angles, name=f"{scope}/aten::sin/Sin"), self.int_const(1))

        pasts = [
            tuple(self.past(i, kind, batch, params["beam_idx"]) for kind in ("key", "value"))
            for i in range(spec.layers)
        ]
        past_len = ops.gather(ops.shape_of(pasts[0][0][0]), self.int_const(2), self.int_const(0))
        new_len = ops.gather(ops.shape_of(hidden), self.int_const(1), self.int_const(0))
        total_len = ops.add(past_len, new_len, name="__module.model/aten::add/Add")
        mask = self.attention_mask(params["attention_mask"], past_len, total_len)
        scale = self.f16_scalar(1.0 / math.sqrt(spec.head_dim))

        sinks = []
        repeat_shape = None
        for i in range(spec.layers):
            (past_k, k_var), (past_v, v_var) = pasts[i]
            scope = f"__module.model.layers.{i}"
            attn = f"{scope}.self_attn"
            normed = self.rms_norm(
                hidden, f"model.layers.{i}.input_layernorm.weight", f"{scope}.input_layernorm"
            )
            q = self.split_heads(
                self.linear(normed, f"model.layers.{i}.self_attn.q_proj", bias=True),
                spec.attention_heads,
                attn,
                "",
            )
            k = self.split_heads(
                self.linear(normed, f"model.layers.{i}.self_attn.k_proj", bias=True),
                spec.kv_heads,
                attn,
                "_1",
            )
            v = self.split_heads(
                self.linear(normed, f"model.layers.{i}.self_attn.v_proj", bias=True),
                spec.kv_heads,
                attn,
                "_2",
            )
            q = self.rotary(q, cos, sin, attn, "")
            k = self.rotary(k, cos, sin, attn, "_1")
            # The export concatenates on axis -2 (== 2 for the 4-D KV layout).
            keys = ops.concat([past_k, k], -2, name=f"{attn}/aten::cat/Concat_2")
            values = ops.concat([past_v, v], -2, name=f"{attn}/aten::cat/Concat_3")
            # ... and its KV Concat the name of the present output it replaced.
            keys.output(0).get_tensor().set_names({f"present.{i}.key"})
            values.output(0).get_tensor().set_names({f"present.{i}.value"})
            sinks += [ops.assign(keys, k_var), ops.assign(values, v_var)]
            if repeat_shape is None and spec.attention_heads != spec.kv_heads:
                # One expand target for all layers, from layer 0's keys, as in the export.
                repeat_shape = self.kv_repeat_shape(keys, total_len)
            keys = self.repeat_kv(keys, repeat_shape, attn, "_2")
            values = self.repeat_kv(values, repeat_shape, attn, "_3")
            context = ops.scaled_dot_product_attention(
                q,
                keys,
                values,
                mask,
                scale,
                causal=False,
                name=f"{attn}/aten::scaled_dot_product_attention/ScaledDotProductAttention",
            )
            context = ops.reshape(
                ops.transpose(context, self.int_const([0, 2, 1, 3])),
                self.int_const([0, 0, spec.attention_heads * spec.head_dim]),
                True,
                name=f"{attn}/aten::reshape/Reshape_2",
            )
            hidden = ops.add(
                hidden,
                self.linear(context, f"model.layers.{i}.self_attn.o_proj", bias=False),
                name=f"{scope}/aten::add/Add",
            )
            normed = self.rms_norm(
                hidden,
                f"model.layers.{i}.post_attention_layernorm.weight",
                f"{scope}.post_attention_layernorm",
            )
            mlp = f"model.layers.{i}.mlp"
            gate = self.silu(
                self.linear(normed, f"{mlp}.gate_proj", bias=False),
                f"__module.{mlp}.act_fn/aten::silu/Swish",
            )
            up = self.linear(normed, f"{mlp}.up_proj", bias=False)
            down = self.linear(
                ops.multiply(gate, up, name=f"__module.{mlp}/aten::mul/Multiply"),
                f"{mlp}.down_proj",
                bias=False,
            )
            hidden = ops.add(hidden, down, name=f"{scope}/aten::add/Add_1")

        normed = self.rms_norm(hidden, "model.norm.weight", "__module.model.norm")
        lm_head = embed if spec.tie_word_embeddings else self.weight("lm_head.weight")
        logits = ops.matmul(
            normed, lm_head, False, True, name="__module.lm_head/aten::linear/MatMul"
        )
        logits.output(0).get_tensor().set_names({"logits"})
        model = ov.Model(
            [ops.result(logits)],
            sinks,
            [params[n] for n in ("input_ids", "attention_mask", "position_ids", "beam_idx")],
            "Model0",
        )
        for key, value in RUNTIME_OPTIONS.items():
            model.set_rt_info(value, ["runtime_options", key])
        model.set_rt_info("ovspec.testing", ["ovspec", "generator"])
        model.set_rt_info(json.dumps(spec.to_json(), sort_keys=True), ["ovspec", "model_spec"])
        return model

    def attention_mask(self, attention_mask: Any, past_len: Any, total_len: Any) -> Any:
        """Float mask [B, 1, S_new, S_total]: 0 where (causal and attention_mask), else min.

        As transformers' sdpa mask export: key position k is visible to query position q
        (absolute, past_len + row) iff k <= q and attention_mask[:, k] is 1.
        """
        ops, ov = self.ops, self.ov
        scope = "__module.model"
        zero, one = self.int_const(0), self.int_const(1)
        key_pos = ops.range(zero, total_len, one, ov.Type.i64, name=f"{scope}/aten::arange/Range")
        query_pos = ops.range(
            past_len, total_len, one, ov.Type.i64, name=f"{scope}/aten::arange/Range_1"
        )
        causal = ops.less_equal(
            ops.unsqueeze(key_pos, self.int_const([0, 1, 2])),
            ops.unsqueeze(query_pos, self.int_const([0, 1, 3])),
            name=f"{scope}/aten::le/LessEqual",
        )
        padding = ops.gather(
            ops.convert(attention_mask, ov.Type.boolean, name=f"{scope}/aten::to/Convert_3"),
            key_pos,
            one,
            name=f"{scope}/aten::index/Gather",
        )
        visible = ops.bitwise_and(
            causal,
            ops.unsqueeze(padding, self.int_const([1, 2])),
            name=f"{scope}/aten::__and__/BitwiseAnd_1",
        )
        return ops.select(
            visible,
            self.f16_scalar(0.0),
            self.f16_scalar(MASK_FILL_VALUE),
            name=f"{scope}/aten::where/Select",
        )

    def kv_repeat_shape(self, keys: Any, total_len: Any) -> Any:
        """[B, kv_heads, groups, S_total, hd]: the expand target of transformers' repeat_kv."""
        ops, spec = self.ops, self.spec
        groups = spec.attention_heads // spec.kv_heads
        batch_heads = ops.gather(ops.shape_of(keys), self.int_const([0, 1]), self.int_const(0))
        return ops.concat(
            [
                batch_heads,
                self.int_const([groups]),
                ops.reshape(total_len, self.int_const([1]), False),
                self.int_const([spec.head_dim]),
            ],
            0,
        )

    def repeat_kv(self, kv: Any, repeat_shape: Any | None, scope: str, suffix: str) -> Any:
        """GQA repeat as the export has it: Unsqueeze -> Broadcast -> Reshape.

        transformers' repeat_kv returns early when every head has its own KV head, so
        then there is no repeat in the graph either.
        """
        spec, ops = self.spec, self.ops
        if repeat_shape is None:
            return kv
        expanded = ops.broadcast(
            ops.unsqueeze(kv, self.int_const(2), name=f"{scope}/aten::unsqueeze/Unsqueeze{suffix}"),
            repeat_shape,
            broadcast_spec="bidirectional",
            name=f"{scope}/aten::expand/Broadcast{suffix}",
        )
        return ops.reshape(
            expanded,
            self.int_const([0, spec.attention_heads, -1, spec.head_dim]),
            True,
            name=f"{scope}/aten::reshape/Reshape{suffix}",
        )


def build_model(spec: ModelSpec) -> ov.Model:
    """The stateful Qwen2 ``ov.Model`` an optimum-intel fp16 export of ``spec`` would hold."""
    return _Qwen2Graph(spec).build()


# --------------------------------------------------------------------------- files


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """The ``config.json`` transformers writes for this Qwen2 shape."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": spec.bos_token_id,
        "dtype": "float16",
        "eos_token_id": spec.eos_token_id,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "layer_types": ["full_attention"] * spec.layers,
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.layers,
        "model_type": "qwen2",
        "num_attention_heads": spec.attention_heads,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": spec.rms_norm_eps,
        # Older readers (optimum, genai) look for rope_theta; transformers 5 for rope_parameters.
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_theta": spec.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab_size,
    }


def generation_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "bos_token_id": spec.bos_token_id,
        "do_sample": False,
        "eos_token_id": spec.eos_token_id,
        "pad_token_id": spec.eos_token_id,
    }


def write_model(spec: ModelSpec, out_dir: Path) -> Path:
    """Write ``openvino_model.xml/.bin``, ``config.json`` and ``generation_config.json``.

    Files are written into a sibling temporary folder that is then renamed to
    ``out_dir``, so a reader never sees a half-written model. ``out_dir`` must not exist
    or be empty. Returns ``out_dir``.
    """
    import openvino as ov

    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelError(
            f"cannot write a synthetic model to {out_dir}: it exists and is not an empty "
            "folder; remove it or choose another"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        model = build_model(spec)
        # compress_to_fp16=False: the weights already are f16 with marked Converts; the
        # default would also try to compress what the export keeps f32 (the norm eps).
        ov.save_model(model, staging / MODEL_XML, compress_to_fp16=False)
        del model
        for file_name, content in (
            ("config.json", hf_config(spec)),
            ("generation_config.json", generation_config(spec)),
        ):
            (staging / file_name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp makes it 0700
        # rename(2) replaces an empty folder; a concurrent writer that won the race makes
        # it fail with ENOTEMPTY, reported below rather than silently overwritten.
        os.replace(staging, out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelError(f"cannot write a synthetic model to {out_dir}: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
