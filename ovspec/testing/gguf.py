"""Tiny seeded GGUF files that openvino-genai's GGUF reader accepts (llama, qwen2).

Owns ``write_gguf``: a llama.cpp-layout file (the tensor names and metadata keys
llama.cpp's converter writes) with seeded random weights, a byte-level BPE tokenizer
and a ChatML chat template, a few hundred KB, for tests. Needs the ``gguf`` package
(a test extra), imported when a file is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ovspec.errors import BadRequestError

if TYPE_CHECKING:
    from numpy.typing import NDArray

ARCHITECTURES = ("llama", "qwen2")
QUANTIZATIONS = ("F16", "Q8_0", "Q4_0")

# Qwen-style ChatML; genai keeps it as the tokenizer's chat template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN_ID = 0  # <|endoftext|>
# Letter pairs merged into one token (and once more after a space).
_PAIR_LETTERS = "thheinerreonatenndtiesorteofedisitalarsttontngseha"
_MERGED_PAIRS = tuple(_PAIR_LETTERS[i : i + 2] for i in range(0, len(_PAIR_LETTERS), 2))


@dataclass(frozen=True)
class GGUFShape:
    """The network's sizes. GGUF readers need head_dim even and rows a multiple of 32."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    context_tokens: int = 2048
    rms_eps: float = 1e-6
    # genai saves the IR it builds with compress_to_fp16, which rounds f32 constants to
    # f16 (the RoPE inverse frequencies, norms, biases). With head_dim 16 and a base of
    # 2**16 every inverse frequency is a power of two, exact in f16, and the writer rounds
    # norms and biases to f16 values: then the saved IR is the very model genai runs from
    # the GGUF (with base 10000 the two drift apart within 80 tokens, measured).
    rope_theta: float = 65536.0
    init_std: float = 0.2

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise BadRequestError("hidden must divide by heads, and heads by kv_heads")
        if self.hidden % 32 or self.intermediate % 32 or (self.hidden // self.heads) % 2:
            raise BadRequestError("hidden and intermediate must be multiples of 32 (quant blocks)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class _Vocab:
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what byte-level BPE vocabularies hold)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def synthetic_vocab() -> tuple[tuple[str, ...], tuple[bool, ...], tuple[str, ...]]:
    """(tokens, is_special, merges): 3 specials, 256 byte tokens, 52 merged pairs."""
    byte_chars = _byte_chars()
    space = byte_chars[ord(" ")]
    tokens = [*SPECIAL_TOKENS, *(byte_chars[b] for b in range(256))]
    special = [True] * len(SPECIAL_TOKENS) + [False] * 256
    merges: list[str] = []
    for pair in _MERGED_PAIRS:
        merges.append(f"{pair[0]} {pair[1]}")
        tokens.append(pair)
    for pair in _MERGED_PAIRS:
        merges.append(f"{space} {pair}")
        tokens.append(space + pair)
    special += [False] * (len(tokens) - len(special))
    return tuple(tokens), tuple(special), tuple(merges)


def random_weights(arch: str, shape: GGUFShape, vocab_size: int, seed: int) -> dict[str, Any]:
    """GGUF-named float32 weights, seeded; q/k/v biases for qwen2 (as Qwen2 has)."""
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> NDArray[np.float32]:
        return (rng.standard_normal((rows, cols)) * shape.init_std).astype(np.float32)

    def norm(n: int) -> NDArray[np.float32]:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> NDArray[np.float32]:
        return (rng.standard_normal(n) * shape.init_std).astype(np.float32)

    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    weights: dict[str, Any] = {
        "token_embd.weight": mat(vocab_size, h),
        "output_norm.weight": norm(h),
        "output.weight": mat(vocab_size, h),
    }
    for i in range(shape.layers):
        block = {
            "attn_norm.weight": norm(h),
            "ffn_norm.weight": norm(h),
            "attn_q.weight": mat(h, h),
            "attn_k.weight": mat(kv, h),
            "attn_v.weight": mat(kv, h),
            "attn_output.weight": mat(h, h),
            "ffn_gate.weight": mat(shape.intermediate, h),
            "ffn_up.weight": mat(shape.intermediate, h),
            "ffn_down.weight": mat(h, shape.intermediate),
        }
        if arch == "qwen2":
            block |= {"attn_q.bias": bias(h), "attn_k.bias": bias(kv), "attn_v.bias": bias(kv)}
        weights |= {f"blk.{i}.{name}": value for name, value in block.items()}
    return weights


def _interleave_rope_rows(w: NDArray[np.float32], heads: int) -> NDArray[np.float32]:
    """llama.cpp's q/k row order for llama (each head's two halves interleaved); genai
    undoes it when it reads a llama GGUF, so the writer must apply it."""
    rows = w.shape[0]
    out: NDArray[np.float32] = (
        w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
    return out


def write_gguf(
    arch: str,
    path: str | Path,
    quant: str = "F16",
    seed: int = 0,
    shape: GGUFShape | None = None,
    chat_template: str | None = CHATML_TEMPLATE,
) -> Path:
    """Write a tiny ``arch`` model with its matmul weights in ``quant``; returns ``path``.

    Norms and biases are F32 (as llama.cpp writes them) holding f16-exact values (see
    ``GGUFShape.rope_theta``). The tokenizer is byte-level BPE (``gpt2``, the only kind
    genai's GGUF reader builds), EOS ``<|endoftext|>`` (id 0).
    """
    import gguf  # a test extra: only this writer needs it

    if arch not in ARCHITECTURES:
        raise BadRequestError(f"architecture {arch!r}: choose one of {', '.join(ARCHITECTURES)}")
    if quant not in QUANTIZATIONS:
        raise BadRequestError(f"quantization {quant!r}: choose one of {', '.join(QUANTIZATIONS)}")
    shape = shape or GGUFShape()
    qtype = gguf.GGMLQuantizationType[quant]
    file_type = {
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[quant]
    tokens, special, merges = synthetic_vocab()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"ovspec-tiny-{arch}-{quant}-seed{seed}")
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(shape.context_tokens)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_freq_base(shape.rope_theta)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(list(tokens))
    kinds = (gguf.TokenType.CONTROL, gguf.TokenType.NORMAL)
    writer.add_token_types([int(kinds[0] if s else kinds[1]) for s in special])
    writer.add_token_merges(list(merges))
    writer.add_bos_token_id(SPECIAL_TOKENS.index("<|im_start|>"))
    writer.add_eos_token_id(EOS_TOKEN_ID)
    writer.add_pad_token_id(EOS_TOKEN_ID)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)

    for name, value in random_weights(arch, shape, len(tokens), seed).items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = shape.heads if "attn_q" in name else shape.kv_heads
            value = _interleave_rope_rows(value, heads)
        if value.ndim == 1:
            writer.add_tensor(name, value.astype(np.float16).astype(np.float32))
        else:
            # Quantized blocks are uint8: let the writer derive the element shape from them
            # (raw_shape would be read as a byte shape).
            writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
