"""The OpenAI API's shapes the server speaks: request bodies (validated by pydantic),
how a request's sampling fields become a ``GenerationConfig``, and the response,
stream-chunk and error documents a client library parses.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ovspec.errors import BadRequestError
from ovspec.runtime.batching import Finish
from ovspec.runtime.sampling import GenerationConfig

# OpenAI's default for /v1/completions; a chat completion runs to the top rung.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_STOP_STRINGS = 4  # as OpenAI allows


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """The fields both endpoints share. Unknown fields are ignored, as OpenAI's SDKs
    send some a server may not know."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # an extension vLLM has too: generate max_tokens regardless

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise BadRequestError(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings")
        return stops

    def config(self, default_max_tokens: int, eos_token_ids: frozenset[int]) -> GenerationConfig:
        """The request as ovspec's generation settings: temperature 0 is greedy (OpenAI's
        default is 1, sampled); without a seed, a fresh one per request."""
        if self.n != 1:
            raise BadRequestError(f"n={self.n}: this server returns one choice (n=1)")
        temperature = 1.0 if self.temperature is None else self.temperature
        sampled = temperature > 0
        return GenerationConfig(
            max_new_tokens=self.max_tokens or default_max_tokens,
            ignore_eos=self.ignore_eos,
            eos_token_ids=eos_token_ids,
            do_sample=sampled,
            temperature=temperature if sampled else 1.0,
            top_p=1.0 if self.top_p is None else self.top_p,
            rng_seed=self.seed if self.seed is not None else secrets.randbits(63),
        )


class CompletionRequest(SamplingFields):
    prompt: str | list[int]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


def finish_reason(finish: Finish | None, stopped_by_text: bool) -> str | None:
    """OpenAI's finish_reason: ``stop`` (EOS or a stop string) or ``length``."""
    if stopped_by_text or finish is Finish.EOS:
        return "stop"
    if finish is Finish.MAX_NEW_TOKENS:
        return "length"
    return None if finish is None else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Reply:
    """The documents of one response: its id, creation time and model, in the shape
    of either endpoint, whole or as stream chunks."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _document(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice}],
        }

    def whole(self, text: str, reason: str | None, counts: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice = {"message": {"role": "assistant", "content": text}, "finish_reason": reason}
            document = self._document("chat.completion", choice)
        else:
            choice = {"text": text, "logprobs": None, "finish_reason": reason}
            document = self._document("text_completion", choice)
        document["usage"] = counts
        return document

    def chunk(self, text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        """A stream chunk: a text increment, or (``text`` None) the closing one."""
        if self.chat:
            delta: dict[str, str] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            return self._document(
                "chat.completion.chunk", {"delta": delta, "finish_reason": reason}
            )
        choice = {"text": text or "", "logprobs": None, "finish_reason": reason}
        return self._document("text_completion", choice)

    def usage_chunk(self, counts: dict[str, int]) -> dict[str, Any]:
        """``stream_options.include_usage``: a last chunk with no choices."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        document = self._document(kind, {})
        document["choices"] = []
        document["usage"] = counts
        return document


ErrorType = Literal[
    "invalid_request_error", "authentication_error", "not_found_error", "rate_limit_error",
    "server_error", "service_unavailable",
]  # fmt: skip


def error_document(message: str, kind: ErrorType, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body, what its client raises from."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
