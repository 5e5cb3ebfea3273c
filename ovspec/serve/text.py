"""Text at the server's edge: prompts to ids (text, token ids, or chat messages through
the model's template), ids back to streamed text, and OpenAI's ``stop`` strings cut
from the text as it streams.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ovspec.errors import BadRequestError, ModelError
from ovspec.ir.model_dir import ModelDir
from ovspec.runtime.chat import chat_template
from ovspec.runtime.textcodec import TextCodec, TextStream, eos_token_ids


class ModelText:
    """One model's tokenizer, detokenizer and chat template, shared by every request.

    The codec is not thread-safe (one infer request per direction): each direction has
    its own lock. Chat templates render with openvino-genai's tokenizer in this process,
    once at start; the template is the operator's model file, not a client's input.
    """

    def __init__(self, model_dir: ModelDir, model_label: str) -> None:
        self.model_label = model_label
        self.codec = TextCodec.for_model(model_dir, model_label)
        self.eos_token_ids = eos_token_ids(model_dir)
        self._encode_lock = threading.Lock()
        self._decode_lock = threading.Lock()
        self._chat: Any = None  # openvino_genai.Tokenizer, when the model has a template
        self._chat_lock = threading.Lock()
        self._chat_missing = f"{model_label} has no chat template; use /v1/completions"
        if chat_template(model_dir) is not None:
            try:
                import openvino_genai
            except ImportError:
                self._chat_missing = (
                    "chat templates render with openvino-genai: pip install 'ovspec[genai]'"
                )
            else:
                self._chat = openvino_genai.Tokenizer(str(model_dir.root))

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """A completion prompt's ids: text through the tokenizer, or ids as given."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        with self._encode_lock:
            ids = self.codec.encode(prompt)
        if not ids:
            raise BadRequestError("the prompt encodes to no tokens; give some text")
        return ids

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Chat messages through the model's template with the generation prompt, then
        encoded without special tokens (the template writes them), as genai does."""
        if self._chat is None:
            raise BadRequestError(self._chat_missing)
        with self._chat_lock:
            try:
                text = self._chat.apply_chat_template(list(messages), add_generation_prompt=True)
                encoded = self._chat.encode(text, add_special_tokens=False)
            except RuntimeError as exc:
                raise ModelError(f"the chat template of {self.model_label} failed: {exc}") from exc
        return [int(i) for i in encoded.input_ids.data.reshape(-1)]

    def stream(self) -> TextStream:
        """Text increments for one sequence; token ids as text when there is no
        detokenizer (a built-in model)."""
        if self.codec.can_decode:
            return TextStream(self._decode)
        return TextStream(lambda ids: "".join(f" {i}" for i in ids))

    def _decode(self, token_ids: Sequence[int]) -> str:
        with self._decode_lock:
            return self.codec.decode(token_ids)


class StopText:
    """OpenAI's ``stop``: text ends before the first stop string, which is not returned.
    Text that could still become a stop string is held back until it cannot."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._held = ""
        self.matched = False

    def push(self, piece: str) -> str:
        """The part of the text so far that is safe to send."""
        if self.matched:
            return ""
        text = self._held + piece
        found = [at for at in (text.find(s) for s in self._stops) if at >= 0]
        if found:
            self.matched = True
            self._held = ""
            return text[: min(found)]
        keep = max((self._prefix_overlap(text, s) for s in self._stops), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self) -> str:
        """What was held back, once no more text comes."""
        held, self._held = ("" if self.matched else self._held), ""
        return held

    @staticmethod
    def _prefix_overlap(text: str, stop: str) -> int:
        """The longest end of ``text`` that begins ``stop``."""
        for size in range(min(len(text), len(stop) - 1), 0, -1):
            if stop.startswith(text[-size:]):
                return size
        return 0
