"""The shapes and seeded weights of the synthetic Qwen2 models: ``ModelSpec``, the
``PRESETS`` behind ``builtin:NAME``, and the weight draws (HF layout, f16-rounded) that
both the IR builder and the numpy reference use.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ovspec.errors import BadRequestError

F16Array = npt.NDArray[np.float16]
F32Array = npt.NDArray[np.float32]

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
    return draw_weight_f32(spec, name).astype(np.float16)


def draw_weight_f32(spec: ModelSpec, name: str) -> F32Array:
    """One weight's seeded draw in f32, before rounding to f16.

    The IR builder hands it to OpenVINO's fp16 compression, which rounds exactly as
    numpy's astype(float16) does (a test checks it).
    """
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
