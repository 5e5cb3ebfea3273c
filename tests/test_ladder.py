"""The ladder value type: parsing, validation, rung selection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovspec.errors import LadderError
from ovspec.ladder import DEFAULT_LADDER_TOKENS, Ladder


def test_default_is_1k_to_8k() -> None:
    assert tuple(Ladder()) == DEFAULT_LADDER_TOKENS == (1024, 2048, 4096, 8192)


def test_parse_accepts_k_suffix_and_spaces() -> None:
    assert tuple(Ladder.parse("1K, 2k,4096")) == (1024, 2048, 4096)
    assert str(Ladder.parse("32,64,128")) == "32,64,128"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "malformed"),
        ("32,,64", "malformed"),
        ("64,32", "not strictly increasing"),
        ("32,32", "not strictly increasing"),
        ("0,32", "not a positive integer"),
        ("-1", "not a positive integer"),
        ("abc", "not a positive integer"),
        ("1.5K", "not a positive integer"),
    ],
)
def test_malformed_ladders_are_rejected(text: str, message: str) -> None:
    with pytest.raises(LadderError, match=message):
        Ladder.parse(text)


def test_rung_over_model_limit_names_both_numbers() -> None:
    with pytest.raises(
        LadderError, match="rung 16384 exceeds the model's max_position_embeddings 8192"
    ):
        Ladder.parse("8K,16K").check_fits(8192)
    Ladder.parse("8K").check_fits(8192)
    Ladder.parse("64K").check_fits(None)


def test_successor() -> None:
    ladder = Ladder((32, 64, 128))
    assert ladder.successor(32) == 64
    assert ladder.successor(128) is None


@given(st.lists(st.integers(1, 1 << 20), min_size=1, max_size=8, unique=True), st.data())
def test_rung_for_is_the_smallest_rung_that_fits(caps: list[int], data: st.DataObject) -> None:
    ladder = Ladder(tuple(sorted(caps)))
    tokens = data.draw(st.integers(0, ladder.top_tokens))
    rung = ladder.rung_for(tokens)
    assert rung >= tokens
    assert all(c < tokens for c in ladder if c < rung)


def test_rung_for_beyond_top_is_an_error() -> None:
    with pytest.raises(LadderError, match="exceed the top rung 128"):
        Ladder((32, 64, 128)).rung_for(129)
