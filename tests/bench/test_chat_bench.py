"""The chat benchmark on a tiny model with minimal settings: both arms run in fresh
processes, the results keep every sample, and the page renders from them (structure, not
figures); the verdict rule follows the interval's bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ovspec.bench.chat.page import first_differences, render, verdict

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
