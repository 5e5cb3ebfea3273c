"""What a command can learn about a model reference before anything is written: the
reference checked (a known preset, a readable GGUF file, an IR folder) and the facts
input checks need (position limit, vocabulary, tokenizer), read without building a
built-in model or converting a GGUF file into a store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from ovspec.errors import ModelError
from ovspec.ir.model_dir import BUILTIN_PREFIX, ModelDir, preset_spec


@dataclass(frozen=True)
class ModelFacts:
    """A checked model reference. ``model_dir``: the folder itself when the reference
    is one (nothing to write); None for a built-in preset or a GGUF file, which are
    written into a store's ``models/`` once a command goes ahead."""

    reference: str
    kind: str  # "folder", "builtin" or "gguf"
    max_position_embeddings: int | None
    has_tokenizer: bool
    model_dir: ModelDir | None = None
    preset_vocab_tokens: int | None = None

    @property
    def writes_into_store(self) -> bool:
        return self.model_dir is None

    @functools.cached_property
    def vocab_tokens(self) -> int | None:
        """The logits' width: a preset's own, a folder's read from its IR when first
        asked; None for a GGUF file (known once its IR is built)."""
        if self.model_dir is not None:
            return _logits_width(self.model_dir)
        return self.preset_vocab_tokens


def model_facts(reference: str) -> ModelFacts:
    """``reference`` checked and described, writing nothing; ``ModelError`` (one line)
    for an unknown preset, a missing or unreadable GGUF file, or a folder that is not
    an IR."""
    from ovspec.ir.gguf import check_readable, is_gguf_reference, read_gguf_header

    if reference.startswith(BUILTIN_PREFIX):
        spec = preset_spec(reference)
        return ModelFacts(
            reference,
            "builtin",
            spec.max_position_embeddings,
            has_tokenizer=False,
            preset_vocab_tokens=spec.vocab_size,
        )
    if is_gguf_reference(reference):
        source = Path(reference).expanduser()
        if not source.is_file():
            raise ModelError(f"GGUF file {source} does not exist")
        header = read_gguf_header(source)
        check_readable(source, header)
        return ModelFacts(reference, "gguf", header.context_tokens, has_tokenizer=True)
    model_dir = ModelDir.open(reference)
    return ModelFacts(
        reference,
        "folder",
        model_dir.max_position_embeddings,
        has_tokenizer=model_dir.tokenizer_xml is not None,
        model_dir=model_dir,
    )


def _logits_width(model_dir: ModelDir) -> int | None:
    """The last dimension of the IR's ``logits`` output, if it is static."""
    import openvino as ov

    from ovspec.errors import openvino_message

    try:
        model = ov.Core().read_model(model_dir.xml_path)
    except RuntimeError as exc:
        raise ModelError(f"cannot read {model_dir.xml_path}: {openvino_message(exc)}") from exc
    for output in model.outputs:
        if "logits" in output.names:
            shape = output.get_partial_shape()
            if shape.rank.is_static and shape.rank.get_length() > 0:
                last = shape[shape.rank.get_length() - 1]
                return last.get_length() if last.is_static else None
    return None
