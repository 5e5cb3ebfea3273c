"""A per-case rerun merged into saved results: the fresh case replaces the saved one,
the others are kept, and the long-context page names every command its cases come from."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ovspec.bench.common.pages import results_path
from ovspec.bench.common.rerun import merge_rerun, sources
from ovspec.bench.long.page import render
from ovspec.bench.long.runner import PAGE
from ovspec.errors import BadRequestError

SAVED = results_path(Path(__file__).resolve().parents[2] / "docs" / "benchmarks", PAGE)


def _saved() -> dict[str, Any]:
    """The committed results as one command's (whatever reruns they hold)."""
    document: dict[str, Any] = json.loads(SAVED.read_text(encoding="utf-8"))
    document.pop("sources", None)
    document["command"] = "python tools/bench_long.py --repetitions 4"
    document["wall_s"] = 1733.0
    return document


def _rerun_of(previous: dict[str, Any], name: str) -> dict[str, Any]:
    case = copy.deepcopy(previous["cases"][name])
    case["config"]["repetitions"] = 99  # marks the fresh copy
    return {
        "cases": {name: case},
        "case_order": [name],
        "wall_s": 600.0,
        "properties": dict(previous["properties"]),
        "command": f"python tools/bench_long.py --cases {name} --keep-other-cases",
    }


def test_a_rerun_replaces_its_case_and_keeps_the_others() -> None:
    previous = _saved()
    name, *others = previous["case_order"]
    merged = merge_rerun(previous, _rerun_of(previous, name))
    assert merged["case_order"] == previous["case_order"]  # the saved order
    assert merged["cases"][name]["config"]["repetitions"] == 99
    for other in others:
        assert merged["cases"][other] == previous["cases"][other]
    made = sources(merged)
    assert [s["cases"] for s in made] == [others, [name]]
    assert made[0]["command"] == previous["command"] and made[0]["wall_s"] == previous["wall_s"]
    assert merged["wall_s"] == pytest.approx(previous["wall_s"] + 600.0)
    # A second rerun of the same case drops the first one's source, not the original's.
    again = merge_rerun(merged, _rerun_of(merged, name))
    assert [s["cases"] for s in sources(again)] == [others, [name]]
    assert sources(again)[1]["command"].endswith("--keep-other-cases")


def test_a_rerun_with_other_properties_is_refused() -> None:
    previous = _saved()
    fresh = _rerun_of(previous, previous["case_order"][0])
    fresh["properties"] = {"INFERENCE_PRECISION_HINT": "bf16"}
    with pytest.raises(BadRequestError, match="other properties"):
        merge_rerun(previous, fresh)


def test_the_page_names_every_command_its_cases_come_from() -> None:
    previous = _saved()
    name = previous["case_order"][-1]
    text = render(merge_rerun(previous, _rerun_of(previous, name)))
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert block == [
        previous["command"],
        f"python tools/bench_long.py --cases {name} --keep-other-cases",
    ]
    assert "Wall time per command: " in text
    assert f"10.0 min (`{name}` from it now)" in text
