"""A model's text side as one public object: encode, decode, its chat template, a
streaming detokenizer and its stop ids, for a model folder, a ``.gguf`` file (the IR
folder ovspec built from it) or a loader. Built on ``textcodec`` and ``chat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ovspec.ir.model_dir import ModelDir, resolve_model, writes_into_store
from ovspec.runtime.chat import chat_prompt_ids, chat_template
from ovspec.runtime.sampling import GenerationConfig
from ovspec.runtime.textcodec import TextCodec, TextStream, eos_token_ids
from ovspec.store.local import Store


class Tokenizer:
    """Text in and out for one model (its openvino-tokenizers IRs, compiled on CPU once).

    Not thread-safe, like the codec under it: one per thread.
    """

    def __init__(self, model_dir: ModelDir, label: str | None = None) -> None:
        self.model_dir = model_dir
        self.label = label or str(model_dir.root)
        self._codec = TextCodec.for_model(model_dir, self.label)

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, as the model's tokenizer makes them (no chat template)."""
        return self._codec.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(token_ids)

    def apply_chat_template(self, message: str) -> list[int]:
        """Prompt ids for one user ``message`` in the model's chat format, the generation
        prompt appended (as genai's ``LLMPipeline.generate(text)`` does)."""
        return chat_prompt_ids(self.model_dir, message, self.label)

    @property
    def has_chat_template(self) -> bool:
        return chat_template(self.model_dir) is not None

    def stream(self) -> TextStream:
        """A streaming detokenizer: ``push(id)`` returns the new text (never half a
        character), ``finish()`` what is held back."""
        return self._codec.stream()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end generation (the model's config, else its tokenizer IR)."""
        return eos_token_ids(self.model_dir)

    def generation_config(self, max_new_tokens: int = 64) -> GenerationConfig:
        """Greedy generation of up to ``max_new_tokens`` that stops at this model's EOS
        (``dataclasses.replace`` it for sampling and stop strings)."""
        return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=self.eos_token_ids)

    @property
    def codec(self) -> TextCodec:
        """The encoder/decoder pair underneath (what ``generate`` takes for stop strings)."""
        return self._codec


def tokenizer(model: str | Path, store: Store | Path | str | None = None) -> Tokenizer:
    """The tokenizer of ``model``: a folder, a ``.gguf`` file (its IR is built into the
    store's models folder once, as ``ovspec.open`` does) or ``builtin:PRESET`` (no
    tokenizer: encoding then raises a one-line ``BadRequestError``)."""
    if isinstance(store, Store):
        return Tokenizer(resolve_model(str(model), store.models_folder), str(model))
    if not writes_into_store(str(model)):  # a folder: no store is opened, or created
        return Tokenizer(resolve_model(str(model), None), str(model))
    with Store(Path(store) if store is not None else Store.default_root()) as opened:
        return Tokenizer(resolve_model(str(model), opened.models_folder), str(model))
