"""A chat on a ``Conversation``: messages in, the model's chat template rendered over the
whole history each turn, and only the tokens past what the KV holds fed (a template that
re-renders an earlier answer differently rewinds the KV to where the two agree, as
genai's chat does). A system prompt is the conversation's cacheable prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ovspec.errors import BadRequestError
from ovspec.runtime.conversation import Conversation, Turn
from ovspec.runtime.sampling import GenerationConfig
from ovspec.runtime.templating import ChatRenderer
from ovspec.runtime.textcodec import TextCodec


class ChatSession:
    """Turns of text on ``conversation``, rendered by ``renderer``, decoded by ``codec``."""

    def __init__(
        self,
        conversation: Conversation,
        renderer: ChatRenderer,
        codec: TextCodec,
        system: str | None = None,
    ) -> None:
        self.conversation = conversation
        self._renderer = renderer
        self._codec = codec
        self.system = system
        self.messages: list[dict[str, str]] = self._opening()

    def _opening(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def say(
        self,
        text: str,
        config: GenerationConfig,
        on_text: Callable[[str], None] | None = None,
    ) -> tuple[Turn, str]:
        """One user message and the model's answer (streamed to ``on_text`` as it comes)."""
        if not text:
            raise BadRequestError("the message is empty; give some text")
        conversation = self.conversation
        asked = [*self.messages, {"role": "user", "content": text}]
        ids = self._renderer.render(asked)
        if not conversation.tokens and self.system:
            system_ids = self._renderer.render(self._opening(), generation_prompt=False)
            if ids[: len(system_ids)] == system_ids:
                conversation.append(system_ids, cache_prefix=True)
        agreed = _common_prefix(conversation.tokens, ids)
        if agreed < len(conversation.tokens):
            conversation.rewind(agreed)
        conversation.append(ids[agreed:])
        stream = self._codec.stream()

        def streamer(token_id: int) -> bool:
            piece = stream.push(token_id)
            if piece and on_text is not None:
                on_text(piece)
            return False

        turn = conversation.generate(config, streamer)
        tail = stream.finish()
        if tail and on_text is not None:
            on_text(tail)
        kept = [t for t in turn.token_ids if t not in config.stop_ids]
        answer = self._codec.decode(kept)
        self.messages = [*asked, {"role": "assistant", "content": answer}]
        return turn, answer

    def encode(self, text: str) -> list[int]:
        """Plain text as token ids (no template): for appending raw text."""
        ids = self._codec.encode(text)
        if not ids:
            raise BadRequestError(f"the text {text!r} encodes to no tokens; give some text")
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(token_ids)

    def reset(self) -> None:
        self.conversation.reset()
        self.messages = self._opening()

    def save(self, path: Path) -> int:
        return self.conversation.save(path, notes={"messages": self.messages})

    def load(self, path: Path) -> None:
        notes = self.conversation.load(path)
        self.messages = _messages(notes, path)

    def close(self) -> None:
        self._renderer.close()
        self.conversation.close()


def _messages(notes: Mapping[str, object], path: Path) -> list[dict[str, str]]:
    found = notes.get("messages", [])
    if not isinstance(found, list) or not all(
        isinstance(m, dict) and all(isinstance(v, str) for v in m.values()) for m in found
    ):
        raise BadRequestError(f"the session {path} holds no chat messages")
    return [dict(m) for m in found]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
