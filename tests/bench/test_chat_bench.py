"""The chat benchmark on a tiny model with minimal settings: both arms run in fresh
processes, the results keep every sample, and the page renders from them (structure, not
figures); the verdict rule follows the interval's bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ovspec.bench.chat.page import first_differences, is_lockstep, render, turn_ratio, verdict

REPO = Path(__file__).resolve().parents[2]


def test_bench_chat_runs_both_arms_and_renders_its_page(qwen2_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pages"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "bench_chat.py"),
            "--model",
            str(qwen2_dir),
            "--ladder",
            "64,128,256",
            "--system-tokens",
            "40",
            "--turns",
            "3",
            "--user-tokens",
            "8",
            "--answer-tokens",
            "5",
            "--repetitions",
            "2",
            "--chunk",
            "16",
            "--work-dir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "results" / "chat.json").read_text())
    assert document["case_order"] == list(document["cases"])
    (results,) = document["cases"].values()
    assert set(results["runs"]) == {"genai", "ovspec"}
    # In lockstep: turns alternate between the arms, the order reversed every turn and
    # every repetition (ABBA).
    assert results["config"]["protocol"] == "lockstep"
    assert results["schedules"][0][:6] == ["genai", "ovspec", "ovspec", "genai", "genai", "ovspec"]
    assert results["schedules"][1][:2] == ["ovspec", "genai"]
    for arm, runs in results["runs"].items():
        assert len(runs) == 2 and all(len(r["turns"]) == 3 for r in runs), arm
        assert all(len(t["token_ids"]) == 5 for r in runs for t in r["turns"])
    ours = results["runs"]["ovspec"][0]
    # Turn 1 prefills the system prompt and its message; later turns their own 8 + 1.
    assert [t["prefilled_tokens"] for t in ours["turns"]] == [48, 9, 9]
    assert all(t["earlier_refed_tokens"] == 0 for t in ours["turns"])
    assert ours["prefix_hit_reused_tokens"] == 40
    # genai is given the whole conversation each turn (it keeps no history for token ids)
    # and so answers as ovspec does, turn after turn (greedy, the same IR).
    theirs = results["runs"]["genai"][0]
    assert [t["prompt_tokens"] for t in theirs["turns"]] == [48, 48 + 5 + 8, 48 + 2 * (5 + 8)]
    assert [t["token_ids"] for t in theirs["turns"]] == [t["token_ids"] for t in ours["turns"]]
    assert "bench_chat.py" in document["command"]
    page = (out / "chat.md").read_text()
    assert page == render(document)
    assert "| tokens of earlier turns prefilled again | 0 | 0 | met |" in page
    assert "not comparable" not in page
    assert "over 4 turn pairs as if independent" in page  # 2 runs x turns 2 and 3
    # Results from before genai was given the history: its first token is not judged.
    for run in results["runs"]["genai"]:
        for turn in run["turns"]:
            del turn["prompt_tokens"]
    assert "| <= 1.0 | not comparable |" in render(document)


def test_verdicts_follow_the_interval_bound() -> None:
    assert verdict([0.5, 0.52, 0.51], 1.0) == "met"
    assert verdict([1.5, 1.52, 1.51], 1.0) == "missed"
    assert verdict([0.5, 1.5], 1.0) == "undecided"
    assert verdict([0.5], 1.0).startswith("undecided")


def test_the_first_difference_is_found_per_repetition() -> None:
    def run(*answers: list[int]) -> dict[str, object]:
        return {"turns": [{"token_ids": a} for a in answers]}

    results = {
        "runs": {
            "ovspec": [run([1, 2], [3, 4]), run([1, 2], [3, 4]), run([1, 2], [3, 4, 5])],
            "genai": [run([1, 2], [3, 9]), run([1, 2], [3, 4]), run([1, 2], [3, 4])],
        }
    }
    assert first_differences(results) == [(2, 2), (2, 3)]


def test_a_lockstep_chat_pairs_first_tokens_within_each_turn() -> None:
    """Per-turn ratios from turn 2 on; the verdict reads one mean per run: ovspec at 1.5×
    genai misses the target, at 0.6× meets it, whatever the turns' own drift."""

    def results(factor: float) -> dict[str, object]:
        def run(scale: float, rep: int) -> dict[str, object]:
            turns = [{"first_token_s": scale * (1 + i / 3) * (1 + rep / 50)} for i in range(6)]
            return {"turns": turns}

        return {
            "config": {"protocol": "lockstep"},
            "runs": {
                "genai": [run(0.1, rep) for rep in range(3)],
                "ovspec": [run(0.1 * factor * (1 + rep / 40), rep) for rep in range(3)],
            },
        }

    slow, fast = turn_ratio(results(1.5)), turn_ratio(results(0.6))
    assert slow.pairs == 15 and slow.run_count == 3
    assert slow.runs is not None and slow.runs.low > 1.0
    assert fast.runs is not None and fast.runs.high < 1.0
    assert is_lockstep(results(1.0)) and not is_lockstep({"config": {}})
