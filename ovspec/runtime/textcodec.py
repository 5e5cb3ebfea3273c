"""Text <-> token ids through a model folder's openvino-tokenizers IRs.

Owns the compiled tokenizer/detokenizer pair, the incremental text stream that
never emits half a UTF-8 character, and the stop (EOS) ids a model folder declares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import openvino as ov

from ovspec.errors import BadRequestError, ModelError, arg, openvino_message
from ovspec.ir.files import read_json_object, read_rt_info
from ovspec.ir.model_dir import DETOKENIZER_XML_NAME, TOKENIZER_XML_NAME, ModelDir

GENERATION_CONFIG_NAME = "generation_config.json"

# What a byte-level detokenizer (or Python's errors="replace") yields for bytes that do
# not yet form a whole character; the stream holds a trailing run of it back.
REPLACEMENT_CHAR = "\ufffd"


class TextCodec:
    """A model's tokenizer and detokenizer, each compiled once on CPU (either may be absent).

    Not thread-safe: each direction owns one infer request.
    """

    def __init__(
        self,
        tokenizer_xml: Path | None,
        detokenizer_xml: Path | None,
        model_label: str = "the model",
    ) -> None:
        self.model_label = model_label
        self._encoder: ov.InferRequest | None = None
        self._decoder: ov.InferRequest | None = None
        self._decoder_dtype: type[np.integer] = np.int64
        if tokenizer_xml is None and detokenizer_xml is None:
            return
        try:
            # Registers the extension ops (string tensors, BPE...) on every new ov.Core.
            import openvino_tokenizers  # noqa: F401
        except ImportError as exc:
            raise ModelError(
                f"{model_label} ships a tokenizer IR but openvino-tokenizers is not installed; "
                "pip install openvino-tokenizers, or pass token ids"
            ) from exc
        core = ov.Core()
        if tokenizer_xml is not None:
            self._encoder = _compile(core, tokenizer_xml).create_infer_request()
        if detokenizer_xml is not None:
            compiled = _compile(core, detokenizer_xml)
            if compiled.input(0).get_element_type() == ov.Type.i32:
                self._decoder_dtype = np.int32
            self._decoder = compiled.create_infer_request()

    @classmethod
    def for_model(cls, model_dir: ModelDir, model_label: str | None = None) -> TextCodec:
        """The codec of ``model_dir`` (``model_label`` names it in error messages)."""
        return cls(
            model_dir.tokenizer_xml,
            model_dir.detokenizer_xml,
            model_label or str(model_dir.root),
        )

    @property
    def can_encode(self) -> bool:
        return self._encoder is not None

    @property
    def can_decode(self) -> bool:
        return self._decoder is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the exported tokenizer makes them (its own special tokens)."""
        if self._encoder is None:
            raise BadRequestError(
                f"{self.model_label} has no {TOKENIZER_XML_NAME}; pass {arg('prompt_ids')} "
                "with token ids instead of a text prompt"
            )
        try:
            self._encoder.infer([ov.Tensor(np.array([text]))])
        except RuntimeError as exc:
            raise ModelError(
                f"the tokenizer of {self.model_label} failed: {openvino_message(exc)}"
            ) from exc
        ids = self._encoder.get_tensor("input_ids").data
        return [int(i) for i in np.asarray(ids).reshape(-1)]

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens skipped if the export says so)."""
        if self._decoder is None:
            raise BadRequestError(f"{self.model_label} has no {DETOKENIZER_XML_NAME}")
        if not token_ids:
            return ""
        batch = np.asarray(token_ids, dtype=self._decoder_dtype).reshape(1, -1)
        try:
            self._decoder.infer([ov.Tensor(batch)])
        except RuntimeError as exc:
            raise ModelError(
                f"the detokenizer of {self.model_label} failed: {openvino_message(exc)}"
            ) from exc
        out = self._decoder.get_output_tensor(0)
        try:
            texts = [str(t) for t in out.str_data]
        except UnicodeDecodeError:
            # An export without utf8_replace_mode hands back raw bytes; replace them here,
            # so a split character always reads as U+FFFD whatever the export.
            texts = [b.decode("utf-8", errors="replace") for b in out.bytes_data]
        return texts[0] if texts else ""

    def stream(self) -> TextStream:
        """A fresh incremental decoder over this codec's detokenizer."""
        return TextStream(self.decode)


class TextStream:
    """Turns ids arriving one by one into text increments whose concatenation is the text.

    Each ``push`` decodes the whole sequence so far and returns the part not yet
    emitted, minus a trailing run of U+FFFD: bytes that may still become a character
    when the next token arrives. ``finish`` returns whatever is held back.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = ""

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    @property
    def emitted(self) -> str:
        """The text returned so far."""
        return self._emitted

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        return self._advance(self._decode(self._ids).rstrip(REPLACEMENT_CHAR))

    def finish(self) -> str:
        """The held-back tail: replacement characters that no later token completed."""
        return self._advance(self._decode(self._ids))

    def _advance(self, text: str) -> str:
        # UTF-8 is prefix-free, so once the trailing partial bytes are held back the
        # decoded text only grows. A detokenizer that rewrites earlier text (clean-up
        # of spaces before punctuation) breaks that; emitted text cannot be taken back,
        # so continue after the emitted length, as transformers' TextStreamer does.
        piece = text[len(self._emitted) :]
        self._emitted += piece
        return piece


def eos_token_ids(model_dir: ModelDir) -> frozenset[int]:
    """Stop ids: ``eos_token_id`` (an int or a list) of generation_config.json and config.json.

    The union, because exports disagree: an instruct model's generation config often
    lists its chat end token beside the base model's EOS that config.json keeps. With
    neither, the tokenizer IR's ``eos_token_id`` (as openvino-genai falls back to it).
    """
    found: set[int] = set()
    path = model_dir.root / GENERATION_CONFIG_NAME
    sources: list[tuple[str, object]] = [("config.json", model_dir.config.get("eos_token_id"))]
    if path.is_file():
        generation = read_json_object(path)
        sources.append((GENERATION_CONFIG_NAME, generation.get("eos_token_id")))
    for source, value in sources:
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ModelError(
                    f"{model_dir.root / source}: eos_token_id {value!r} is not a token id "
                    "or a list of them"
                )
            found.add(v)
    if not found and model_dir.tokenizer_xml is not None:
        eos = read_rt_info(model_dir.tokenizer_xml).get("eos_token_id", "")
        if eos.isdigit():
            found.add(int(eos))
    return frozenset(found)


def _compile(core: ov.Core, xml: Path) -> ov.CompiledModel:
    try:
        return core.compile_model(core.read_model(xml), "CPU")
    except RuntimeError as exc:
        raise ModelError(f"cannot load {xml}: {openvino_message(exc)}") from exc
