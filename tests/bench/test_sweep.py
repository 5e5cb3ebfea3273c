"""The sweep's grid and ladder parsing (the page itself is covered by test_pages)."""

from __future__ import annotations

import pytest

from ovspec.bench.sweep.runner import SweepGrid, parse_ladders
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder


def test_the_grid_is_every_preset_ladder_and_precision() -> None:
    ladders = parse_ladders(["doubling=128,256,512", "fine=128,256,384,512"])
    assert ladders == (
        ("doubling", Ladder((128, 256, 512))),
        ("fine", Ladder((128, 256, 384, 512))),
    )
    grid = SweepGrid(("tiny", "small", "kv-heavy"), ladders, ("none", "int8", "int4"), 64, 3)
    cells = grid.cells()
    assert len(cells) == 18 and len(set(cells)) == 18
    assert cells[0] == ("tiny", "doubling", Ladder((128, 256, 512)), "none")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repetitions": 1}, "--repetitions 2 or more"),
        ({"prompt_tokens": 512}, "does not fit ladder"),
        ({"presets": ()}, "at least one preset"),
    ],
)
def test_the_grid_refuses_what_it_cannot_run(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "presets": ("tiny",),
        "ladders": parse_ladders(["d=128,256,512"]),
        "compressions": ("none",),
        "prompt_tokens": 64,
        "repetitions": 3,
    }
    with pytest.raises(BadRequestError, match=message):
        SweepGrid(**{**base, **kwargs})  # type: ignore[arg-type]


def test_ladders_need_a_name() -> None:
    with pytest.raises(BadRequestError, match="NAME=RUNGS"):
        parse_ladders(["128,256"])
