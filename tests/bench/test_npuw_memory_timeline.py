"""tools/npuw_memory_timeline.py: a cold store's process compiles its rungs and a warm
one's only imports them, each arm in a process of its own, and a failing arm is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "npuw_memory_timeline.py"
QWEN2 = ROOT / "tests" / "data" / "qwen2"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--model", str(QWEN2), "--ladder", "64,128", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_the_cold_arm_compiles_its_rungs_and_the_warm_arm_imports_them() -> None:
    done = _run("--prompt-tokens", "20", "--new-tokens", "50", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout)
    assert list(results) == ["cold", "warm"]

    def rung_compiles(arm: str) -> list[str]:
        events = [e["event"] for e in results[arm]["events"]]
        return [e for e in events if e.startswith("> compile_model") and "@" in e]

    assert any("decode@128" in e for e in rung_compiles("cold"))  # the boundary was crossed
    assert rung_compiles("warm") == []
    for arm in results.values():
        assert arm["peak"]["VmRSS"] >= arm["end"]["RssAnon"] > 0
    # The cold arm exports what it compiles, and every call reports the sampler's pause
    # inside it (at most the call's own length).
    cold = results["cold"]["events"]
    assert any(e["event"] == "< export_model" for e in cold)
    entered: dict[tuple[str, str], float] = {}
    for e in cold:
        call = (e["thread"], e["event"][2:].split()[0])
        if e["event"].startswith(">"):
            entered[call] = e["s"]
        elif e["event"].startswith("<") and call in entered:
            assert 0 <= e["pause_s"] <= e["s"] - entered.pop(call) + 0.002


def test_a_failing_arm_is_one_line() -> None:
    done = _run("--prompt-tokens", "200")  # over the top rung
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("npuw_memory_timeline: the cold run failed: ")
    assert "Traceback" not in done.stderr
