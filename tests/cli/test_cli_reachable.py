"""``ovspec generate`` builds no rung its request cannot reach, and does not wait at exit
for a build no token of the answer needs (``--prewarm`` does)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli

QWEN2 = Path(__file__).resolve().parents[1] / "data" / "qwen2"
LADDER = "32,64,128,256"
PROMPT_IDS = ",".join(str(i) for i in range(1, 37))  # 36 tokens: rung 64


def started_specs(max_new_tokens: int, store: Path, *extra: str) -> tuple[list[int], set[str]]:
    args = ["generate", str(QWEN2), "--ids", PROMPT_IDS, "--ladder", LADDER]
    args += ["--max-new-tokens", str(max_new_tokens), "--load-mode", "compile"]
    args += ["--cache-dir", str(store), "--ignore-eos", "--json", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    starts = {e["spec"] for e in document["events"] if e["kind"] == "load_start"}
    return document["rungs"], starts


@pytest.mark.parametrize(
    ("max_new_tokens", "reached", "never"),
    [
        (10, [64], {"decode@128", "decode@256"}),  # 36 + 9 fed back: rung 64
        (40, [64, 128], {"decode@256"}),  # 36 + 39: rung 128, never 256
    ],
)
def test_no_rung_beyond_prompt_plus_max_new_tokens_is_started(
    max_new_tokens: int, reached: list[int], never: set[str], tmp_path: Path
) -> None:
    rungs, starts = started_specs(max_new_tokens, tmp_path / "store")
    assert rungs == reached
    assert {f"decode@{c}" for c in reached} <= starts  # the events are there to look at
    assert not starts & never


def test_prewarm_waits_for_every_build_it_started(tmp_path: Path) -> None:
    rungs, starts = started_specs(10, tmp_path / "store", "--prewarm")
    assert rungs == [64] and "decode@128" not in starts


def test_the_entry_point_exits_past_a_build_nobody_waits_for(tmp_path: Path) -> None:
    """A worker thread still compiling when the command ends does not hold the process:
    without the entry point's exit the interpreter would join it (and this would hang)."""
    script = (
        "import sys, threading\n"
        "import ovspec.runtime.worker as worker\n"
        "threading.Thread(target=threading.Event().wait, name=worker.WORKER_THREAD_PREFIX + '_0')"
        ".start()\n"
        "sys.argv = ['ovspec', '--version']\n"
        "from ovspec.cli import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ovspec" in done.stdout  # the output was flushed before the exit
