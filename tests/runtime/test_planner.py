"""The plan workflow as a library call: a request checked when it is made, costs from
the caller or the store, and the report the CLI renders."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder
from ovspec.runtime.plan import RungValues
from ovspec.runtime.planner import PlanRequest, make_plan
from ovspec.runtime.schedule import EarlyStartRule
from ovspec.store.local import Store

K = 1024
LADDER = Ladder((1 * K, 2 * K, 4 * K, 8 * K))


def request(**changes: object) -> PlanRequest:
    fields: dict[str, object] = {
        "model": "unused",
        "ladder": LADDER,
        "prompt_tokens": 128,
        "compile_s": RungValues.parse("1024=5,2048=6,4096=12,8192=12", "--compile-s"),
        "decode_ms": RungValues.parse("10", "--decode-ms"),
        **changes,
    }
    return PlanRequest(**fields)  # type: ignore[arg-type]


def test_given_costs_plan_without_a_store() -> None:
    report = make_plan(request(rule=EarlyStartRule.WINDOW))
    assert not report.request.reads_store
    assert report.model == "unused" and report.sources == {
        "compile": "--compile-s",
        "decode": "--decode-ms",
    }
    assert math.isclose(report.one_ahead.wait_s, 1.76)
    assert report.planned is not None and report.shown is report.planned
    assert report.shown.wait_s == 0
    assert report.conclusion.startswith("one-ahead would stall at 2048→4096 by 1.76 s")
    document = report.to_json()
    assert document["new_tokens"] == 8 * K - 128
    assert document["conclusion"] == report.conclusion


def test_early_start_off_shows_pure_one_ahead() -> None:
    report = make_plan(request(early_start=False))
    assert report.planned is None and report.shown is report.one_ahead


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"measure": True}, "decode_ms= and measure= both give the decode rate"),
        ({"new_tokens": 9000}, "over the top rung 8192"),
        ({"compile_s": RungValues.parse("3000=1", "--compile-s")}, "compile_s= names rung 3000"),
        ({"decode_ms": RungValues.parse("1024=1", "--decode-ms")}, "decode_ms= has no value"),
    ],
)
def test_a_bad_request_fails_when_it_is_made(changes: dict[str, object], match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        request(**changes)


def test_costs_from_the_store_need_one(tmp_path: Path) -> None:
    missing_compile = request(compile_s=None)
    assert missing_compile.reads_store and not missing_compile.measures
    with pytest.raises(BadRequestError, match="needs a store"):
        make_plan(missing_compile)
    tiny = request(model="builtin:tiny", ladder=Ladder((32, 64)), prompt_tokens=16, compile_s=None)
    with Store(tmp_path / "store") as store, pytest.raises(BadRequestError) as failed:
        make_plan(tiny, store)
    assert "no compile history for decode@32, decode@64" in str(failed.value)
    assert (tmp_path / "store" / "models").is_dir()  # the preset went into the store's models/
