"""A prompt as a user gives it: exactly one of text, a chat message or ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import ModelDir
from ovspec.runtime.prompting import Prompt
from ovspec.runtime.textcodec import TextCodec


class _Codec:
    """Encodes each word as its length."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


CODEC = cast(TextCodec, _Codec())
MODEL = cast(ModelDir, None)  # text and ids never read the model folder


@pytest.mark.parametrize(
    "kwargs", [{}, {"text": "a", "ids": (1,)}, {"text": "a", "chat": "b"}, {"chat": "b", "ids": ()}]
)
def test_a_prompt_is_exactly_one_thing(kwargs: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError, match="exactly one"):
        Prompt(**kwargs)


def test_text_is_encoded_as_is_and_ids_are_taken_as_they_are() -> None:
    assert Prompt(text="one three").token_ids(MODEL, CODEC, "m") == [3, 5]
    assert Prompt(ids=(7, 8)).token_ids(MODEL, CODEC, "m") == [7, 8]
    with pytest.raises(BadRequestError, match="encodes to no tokens"):
        Prompt(text=" ").token_ids(MODEL, CODEC, "m")


def test_a_chat_message_needs_the_models_template(tiny_dir: Path) -> None:
    with pytest.raises(BadRequestError, match="no chat template"):
        Prompt(chat="hello").token_ids(ModelDir.open(tiny_dir), CODEC, "tiny")
