"""The long-context benchmark: its verdicts follow the interval's bound, a tiny case
runs end to end (genai and the paged path, real processes) and renders its page, and
the llama.cpp arm is refused without a GGUF and its interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovspec.bench.common.models import docstring_text
from ovspec.bench.common.pages import render_saved, write_page
from ovspec.bench.long import lockstep_page
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
        first_token_pairs=2,
        block_tokens=4,
        batch_pairs=2,
    )
    done = results["cases"]["tiny"]
    runs, first = done["runs"], done["first_token_runs"]
    # The side peer in the first lockstep run and first-token pair only; the warm-up runs
    # are not kept.
    for kept in (runs, first):
        assert sorted(r["arm"] for r in kept) == sorted(
            ["genai", "ovspec-paged"] * 2 + ["genai-sdpa"]
        )
        assert [r["repetition"] for r in kept if r["arm"] == "genai-sdpa"] == [0]
    assert all(len(r["token_ids"]) == 30 for r in runs)  # full lists kept
    assert all(len(r["token_ids"]) == 2 for r in first)
    # The first token alone, then blocks of 4: 29 tokens in 8 windows (and its exit's).
    # How many windows depends on when a SIGSTOP lands (a late one lets a block run
    # long, or the load run past its first token); what must hold: at most 9 windows, and
    # every token after the load's inside one.
    for r in runs:
        assert 1 <= len(r["windows_s"]) <= 9
        for t in (t for t in r["token_s"] if t >= r["windows_s"][0][0]):
            assert any(a - 1e-3 <= t <= b + 1e-3 for a, b in r["windows_s"]), (t, r["windows_s"])
    assert done["config"]["protocol"] == "lockstep" and done["config"]["new_tokens"] == 30
    results["command"] = "python tools/bench_long.py --cases tiny"
    text = write_page(tmp_path / "pages", PAGE, results).read_text(encoding="utf-8")
    assert "| spawn → first token (s) |" in text
    assert "| decode, 64–128 live (ms/token) |" in text
    assert "`ovspec-paged`: 2/2 runs' full token lists equal genai's" in text
    assert "`genai-sdpa`: 1/1 runs' full token lists equal genai's" in text
    assert "| figure | genai | ovspec-paged | genai-sdpa |" in text
    assert "2 pairs of fresh processes making 2 tokens" in text
    assert "| band | pairs | block pairs as independent | batches | batch means |" in text
    assert render_saved(tmp_path / "pages", PAGE) == text


def test_a_decode_verdict_reads_the_batch_means_of_paired_blocks() -> None:
    """A lockstep case whose ovspec blocks are 1.3× genai's misses the decode target;
    the same blocks at 0.9× meet it (the figures come from the saved windows)."""

    def run(arm: str, rep: int, ms: float) -> dict[str, object]:
        times = [1.0 + i * ms / 1000 for i in range(65)]
        windows = [[times[1 + 8 * k] - 1e-4, times[8 * (k + 1)] + 1e-4] for k in range(8)]
        return {"arm": arm, "repetition": rep, "token_s": times, "windows_s": windows}

    def case(slower: float) -> dict[str, object]:
        config = {"protocol": "lockstep", "prompt_tokens": 10, "bands": [[10, 100]]}
        config["batch_pairs"] = 2
        runs = []
        for rep in range(3):
            base = 20.0 + rep + 0.5 * (rep % 2)
            runs += [
                run("genai", rep, base),
                run("ovspec-paged", rep, base * slower * (1 + rep / 100)),
            ]
        return {"config": config, "runs": runs}

    (slow,) = lockstep_page.band_ratios(case(1.3), "ovspec-paged").values()
    (fast,) = lockstep_page.band_ratios(case(0.9), "ovspec-paged").values()
    assert verdict(lockstep_page.summary(slow), 1.10) == "not met"
    assert verdict(lockstep_page.summary(fast), 1.10) == "met"
    assert slow.pairs == 3 * 8 and slow.batch_count == 3 * 4
