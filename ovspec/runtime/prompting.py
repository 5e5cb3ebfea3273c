"""A prompt as a user gives it, and the token ids it stands for.

Text goes through the model's tokenizer IR as is, a chat message through the model's
chat template (``runtime.chat``), token ids are taken as they are; exactly one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import ModelDir
from ovspec.runtime.chat import chat_prompt_ids
from ovspec.runtime.textcodec import TextCodec


@dataclass(frozen=True)
class Prompt:
    """One of: ``text`` (encoded as is), ``chat`` (one user message), ``ids``."""

    text: str | None = None
    chat: str | None = None
    ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.text, self.chat, self.ids)) != 1:
            raise BadRequestError("give exactly one of a text prompt, a chat message or ids")

    def token_ids(self, model_dir: ModelDir, codec: TextCodec, model_label: str) -> list[int]:
        """The prompt's ids for ``model_dir`` (``codec``: its tokenizer)."""
        if self.chat is not None:
            return chat_prompt_ids(model_dir, self.chat, model_label)
        if self.ids is not None:
            return list(self.ids)
        assert self.text is not None  # exactly one is set
        ids = codec.encode(self.text)
        if not ids:
            raise BadRequestError(f"the prompt {self.text!r} encodes to no tokens; give some text")
        return ids
