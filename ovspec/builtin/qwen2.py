"""Synthetic Qwen2 IRs, so ovspec runs and tests without downloading a model.

Builds, op by op, the stateful IR ``optimum-cli export openvino --task
text-generation-with-past`` writes for Qwen2 (fp16-compressed weights) from a
``presets.ModelSpec``, and writes it next to ``config.json`` and ``generation_config.json``.
Longer than 500 lines: one class mirrors one export op by op, and splitting it would
scatter a single graph over several files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ovspec.builtin.presets import ModelSpec, draw_weight_f32, rope_inv_freq
from ovspec.errors import ModelError

if TYPE_CHECKING:
    import openvino as ov


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

# --------------------------------------------------------------------------- graph


@dataclass
class _Attention:
    """What every layer's attention shares: the mask, the scale, the rotary tables, the
    total length, and the GQA expand target (made from the first layer's keys)."""

    mask: Any
    scale: Any
    cos: Any
    sin: Any
    total_len: Any
    repeat_shape: Any | None = None


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
                "ovspec's built-in models"
            )
        # ov.Model named the Convert's tensor after the holder's Result; drop that name.
        # The holder (and its Result) dies on return; the Convert lives on in the graph.
        decompressed.get_tensor().set_names(set())
        return decompressed

    def weight(self, name: str, shape: tuple[int, ...] | None = None) -> Any:
        values = draw_weight_f32(self.spec, name)
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
        ops, spec = self.ops, self.spec
        params = self.parameters()
        input_ids = params["input_ids"]
        batch = ops.gather(ops.shape_of(input_ids), self.int_const([0]), self.int_const(0))
        embed = self.weight("model.embed_tokens.weight")
        hidden = ops.gather(
            embed,
            ops.convert(
                input_ids,
                self.ov.Type.i32,
                name="__module.model.embed_tokens/aten::embedding/Convert",
            ),
            self.int_const(0),
            name="__module.model.embed_tokens/aten::embedding/Gather",
        )
        cos, sin = self.rotary_tables(params["position_ids"])
        pasts = [
            tuple(self.past(i, kind, batch, params["beam_idx"]) for kind in ("key", "value"))
            for i in range(spec.layers)
        ]
        past_len = ops.gather(ops.shape_of(pasts[0][0][0]), self.int_const(2), self.int_const(0))
        new_len = ops.gather(ops.shape_of(hidden), self.int_const(1), self.int_const(0))
        total_len = ops.add(past_len, new_len, name="__module.model/aten::add/Add")
        attention = _Attention(
            mask=self.attention_mask(params["attention_mask"], past_len, total_len),
            scale=self.f16_scalar(1.0 / math.sqrt(spec.head_dim)),
            cos=cos,
            sin=sin,
            total_len=total_len,
        )
        sinks: list[Any] = []
        for i in range(spec.layers):
            hidden = self.attention_block(i, hidden, pasts[i], attention, sinks)
            hidden = self.mlp_block(i, hidden)
        normed = self.rms_norm(hidden, "model.norm.weight", "__module.model.norm")
        lm_head = embed if spec.tie_word_embeddings else self.weight("lm_head.weight")
        logits = ops.matmul(
            normed, lm_head, False, True, name="__module.lm_head/aten::linear/MatMul"
        )
        logits.output(0).get_tensor().set_names({"logits"})
        return self.model(logits, sinks, params)

    def parameters(self) -> dict[str, Any]:
        """The export's four inputs, by name, each with its tensor named after it."""
        ov, ops = self.ov, self.ops
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
        return params

    def rotary_tables(self, position_ids: Any) -> tuple[Any, Any]:
        """cos and sin from position_ids, shared by all layers: [B, 1, S, hd]. Like the
        export, the inverse frequencies are an f16-compressed constant too."""
        ov, ops = self.ov, self.ops
        scope = "__module.model.rotary_emb"
        inv_freq = self.compressed(
            rope_inv_freq(self.spec).reshape(1, -1, 1), f"{scope}/aten::to/Convert"
        )
        positions = ops.convert(
            ops.unsqueeze(position_ids, self.int_const(1)),
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
        return cos, sin

    def attention_block(
        self,
        i: int,
        hidden: Any,
        past: tuple[Any, ...],
        attention: _Attention,
        sinks: list[Any],
    ) -> Any:
        """Layer ``i``'s self-attention with its residual; appends the KV Assigns to
        ``sinks`` and fixes the GQA expand target at the first layer that needs it."""
        ops, spec = self.ops, self.spec
        (past_k, k_var), (past_v, v_var) = past
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
        q = self.rotary(q, attention.cos, attention.sin, attn, "")
        k = self.rotary(k, attention.cos, attention.sin, attn, "_1")
        # The export concatenates on axis -2 (== 2 for the 4-D KV layout).
        keys = ops.concat([past_k, k], -2, name=f"{attn}/aten::cat/Concat_2")
        values = ops.concat([past_v, v], -2, name=f"{attn}/aten::cat/Concat_3")
        # ... and its KV Concat the name of the present output it replaced.
        keys.output(0).get_tensor().set_names({f"present.{i}.key"})
        values.output(0).get_tensor().set_names({f"present.{i}.value"})
        sinks += [ops.assign(keys, k_var), ops.assign(values, v_var)]
        if attention.repeat_shape is None and spec.attention_heads != spec.kv_heads:
            # One expand target for all layers, from layer 0's keys, as in the export.
            attention.repeat_shape = self.kv_repeat_shape(keys, attention.total_len)
        keys = self.repeat_kv(keys, attention.repeat_shape, attn, "_2")
        values = self.repeat_kv(values, attention.repeat_shape, attn, "_3")
        context = ops.scaled_dot_product_attention(
            q,
            keys,
            values,
            attention.mask,
            attention.scale,
            causal=False,
            name=f"{attn}/aten::scaled_dot_product_attention/ScaledDotProductAttention",
        )
        context = ops.reshape(
            ops.transpose(context, self.int_const([0, 2, 1, 3])),
            self.int_const([0, 0, spec.attention_heads * spec.head_dim]),
            True,
            name=f"{attn}/aten::reshape/Reshape_2",
        )
        return ops.add(
            hidden,
            self.linear(context, f"model.layers.{i}.self_attn.o_proj", bias=False),
            name=f"{scope}/aten::add/Add",
        )

    def mlp_block(self, i: int, hidden: Any) -> Any:
        """Layer ``i``'s post-attention norm and SwiGLU MLP with its residual."""
        ops = self.ops
        scope = f"__module.model.layers.{i}"
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
        return ops.add(hidden, down, name=f"{scope}/aten::add/Add_1")

    def model(self, logits: Any, sinks: list[Any], params: Mapping[str, Any]) -> ov.Model:
        """The ``ov.Model`` with the export's rt_info: its runtime options and our spec."""
        ops, spec = self.ops, self.spec
        model = self.ov.Model(
            [ops.result(logits)],
            sinks,
            [params[n] for n in ("input_ids", "attention_mask", "position_ids", "beam_idx")],
            "Model0",
        )
        for key, value in RUNTIME_OPTIONS.items():
            model.set_rt_info(value, ["runtime_options", key])
        # A stable label (the builder's module before it moved to ovspec.builtin): a new
        # value would change every built-in model's IR, and so its keys.
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


def write_model_files(spec: ModelSpec, folder: Path) -> None:
    """Write the model's files into ``folder`` (existing, empty). Not atomic: a store's
    models/ writes into a staging folder it holds (``ovspec.ir.materialize``)."""
    import openvino as ov

    model = build_model(spec)
    # compress_to_fp16=False: the weights already are f16 with marked Converts; the
    # default would also try to compress what the export keeps f32 (the norm eps).
    ov.save_model(model, folder / MODEL_XML, compress_to_fp16=False)
    del model
    for file_name, content in (
        ("config.json", hf_config(spec)),
        ("generation_config.json", generation_config(spec)),
    ):
        (folder / file_name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def write_model(spec: ModelSpec, out_dir: Path) -> Path:
    """Write ``openvino_model.xml/.bin``, ``config.json`` and ``generation_config.json``.

    Files are written into a sibling temporary folder that is then renamed to
    ``out_dir``, so a reader never sees a half-written model. ``out_dir`` must not exist
    or be empty. Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelError(
            f"cannot write a synthetic model to {out_dir}: it exists and is not an empty "
            "folder; remove it or choose another"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        write_model_files(spec, staging)
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
