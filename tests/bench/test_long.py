"""The long-context benchmark: its verdicts follow the interval's bound, a tiny case
runs end to end (genai and the paged path, real processes) and renders its page, and
the llama.cpp arm is refused without a GGUF and its interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovspec.bench.common.models import docstring_text
from ovspec.bench.common.pages import render_saved, write_page
from ovspec.bench.long.page import verdict
from ovspec.bench.long.runner import PAGE, LongCase, run_long
from ovspec.bench.speed.runner import SpeedConfig
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES


def test_a_verdict_is_decided_by_the_interval_bound() -> None:
    assert verdict({"ratio": 0.9, "ci": [0.85, 0.99]}, 1.0) == "met"
    assert verdict({"ratio": 0.98, "ci": [0.9, 1.05]}, 1.0) == "undecided"
    assert verdict({"ratio": 1.2, "ci": [1.1, 1.3]}, 1.0) == "not met"
    assert verdict(None, 1.0).startswith("undecided")


def test_the_prompt_text_is_long_real_prose() -> None:
    text = docstring_text()
    assert len(text.split()) > 5000  # well over 3,000 tokens of it
    assert text == docstring_text()  # the same text every run


def test_the_llamacpp_arm_needs_a_gguf_and_its_interpreter(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match=r"llama\.cpp arm"):
        SpeedConfig("builtin:tiny", tmp_path, arms=("genai", "llama.cpp"))


def test_a_tiny_case_runs_and_renders_its_page(tmp_path: Path) -> None:
    case = LongCase("tiny", "builtin:tiny", 40, 30, "32,64,128", sdpa_peer=True)
    results = run_long(
        tmp_path / "work",
        [case],
        2,
        EXACT_CPU_PROPERTIES,
        prefill_chunk_tokens=16,
        side_repetitions=1,
    )
    runs = results["cases"]["tiny"]["runs"]
    # The side peer in the first repetition only; the warm-up runs are not kept.
    assert sorted(r["arm"] for r in runs) == sorted(["genai", "ovspec-paged"] * 2 + ["genai-sdpa"])
    assert [r["repetition"] for r in runs if r["arm"] == "genai-sdpa"] == [0]
    assert all(len(r["token_ids"]) == 30 for r in runs)  # full lists kept
    results["command"] = "python tools/bench_long.py --cases tiny"
    text = write_page(tmp_path / "pages", PAGE, results).read_text(encoding="utf-8")
    assert "| spawn → first token (s) |" in text
    assert "| decode, 64–128 live (ms/token) |" in text
    assert "`ovspec-paged`: 2/2 runs' full token lists equal genai's" in text
    assert "`genai-sdpa`: 1/1 runs' full token lists equal genai's" in text
    assert "| figure | genai | ovspec-paged | genai-sdpa |" in text
    assert render_saved(tmp_path / "pages", PAGE) == text
