"""The speed benchmark's figures, its page, and one tiny run end to end (issue 9)."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import ovspec
from ovspec.bench.common.pages import render_saved, write_page
from ovspec.bench.speed import arm as speed_arm
from ovspec.bench.speed.arm import ArmRequest, MemorySampler
from ovspec.bench.speed.runner import (
    PAGE,
    SpeedConfig,
    _spawn,
    arm_module,
    materialize,
    run_order,
    run_speed,
)
from ovspec.bench.speed.stats import band_ms, boundary_steps_ms, paired_band_ratios
from ovspec.errors import BadRequestError, TrialError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder


def test_band_ms_assigns_each_step_by_the_kv_it_started_from() -> None:
    # prompt 4: token 0 from the prompt; step i starts from 4 + i - 1 live tokens.
    token_s = [1.0, 1.010, 1.030, 1.060, 1.100]  # steps of 10, 20, 30, 40 ms
    assert band_ms(token_s, 4, (4, 6)) == pytest.approx(15.0)  # steps from 4 and 5
    assert band_ms(token_s, 4, (6, 8)) == pytest.approx(35.0)
    assert band_ms(token_s, 4, (8, 16)) is None


def run(arm: str, token_s: list[float], ids: list[int], rep: int = 0) -> dict[str, object]:
    return {
        "arm": arm,
        "repetition": rep,
        "token_s": token_s,
        "token_ids": ids,
        "done_s": token_s[-1],
        "vm_hwm_mib": 100.0,
        "peak_pss_mib": 90.0,
        "peak_anon_mib": 50.0,
        "boundary_wait_s": [0.01],
    }


def test_boundary_steps_are_the_steps_from_a_full_rung() -> None:
    # prompt 4 on rungs 4, 6, 8: steps from 4 (i = 1) and 6 (i = 3) live tokens cross.
    token_s = [1.0, 1.050, 1.060, 1.130, 1.140, 1.150]
    assert boundary_steps_ms(token_s, 4, [8, 4, 6]) == pytest.approx([50.0, 70.0])
    assert boundary_steps_ms(token_s, 5, [4, 6, 8]) == pytest.approx([10.0])  # past 4
    assert boundary_steps_ms(token_s[:3], 4, [4, 6, 8]) == pytest.approx([50.0])  # ended
    assert boundary_steps_ms(token_s, 4, [8]) == []  # one rung: nothing to cross


def test_a_boundary_cell_takes_each_crossing_over_the_runs_that_reached_it() -> None:
    from ovspec.bench.speed.page import _boundary_cell

    assert _boundary_cell([[200.0, 100.0], [220.0], [240.0, 120.0]]) == "220 / 110 (max 240)"
    assert _boundary_cell([[], []]) == "–" and _boundary_cell([]) == "–"


def _case(runs: list[dict[str, object]], prompt: int, bands: list[list[int]]) -> dict[str, object]:
    arms = sorted({str(r["arm"]) for r in runs}, key=lambda a: a != "genai")
    config = {
        "model": "builtin:tiny",
        "ladder": "2,3,5",
        "prompt_tokens": prompt,
        "new_tokens": 4,
        "repetitions": 3,
        "properties": {},
        "bands": bands,
        "arms": [[a, f"the {a} arm"] for a in arms],
        "prompt_text": "real",
    }
    environment = {"cpu_model": "cpu", "usable_cores": 2, "openvino": "x", "git_commit": "abc"}
    return {"config": config, "environment": environment, "runs": runs, "wall_s": 60.0}


def test_the_page_is_computed_from_the_runs_and_decided_by_intervals() -> None:
    """No stored summary: ratios, token checks and verdicts come from the runs."""
    from ovspec.bench.speed.page import render_page

    runs = []
    for rep, (wobble, factor) in enumerate(((1.0, 2.0), (1.02, 2.1), (0.98, 1.9))):
        step = 0.01 * wobble
        runs.append(run("genai", [1.0 + step * i for i in range(4)], [5, 6, 7, 8], rep))
        slow = [2.0 + 0.1 * rep + factor * step * i for i in range(4)]  # ~2x genai
        runs.append(run("ovspec-warm", slow, [5, 6, 7, 8], rep))
        runs.append(run("ovspec-cold", [3.0 + step * i for i in range(4)], [5, 6, 7, 9], rep))
    document = {
        "cases": {"tiny": _case(runs, 2, [[2, 3], [3, 5]])},
        "case_order": ["tiny"],
        "command": "python tools/bench_speed.py --model builtin:tiny",
        "wall_s": 60.0,
    }
    text = render_page(document)
    assert re.search(r"^\| `ovspec-warm` \| 20\.\d \(2\.00× \[1\.\d\d, 2\.\d\d\]\)", text, re.M)
    warm_decode = next(
        x
        for x in text.splitlines()
        if x.startswith("| decode ≤ 1.10× genai in every band (`ovspec-warm`)")
    )
    assert warm_decode.endswith("| **not met** |")
    cold_tokens = next(
        x
        for x in text.splitlines()
        if x.startswith("| full token lists equal genai's (`ovspec-cold`)")
    )
    assert cold_tokens.endswith("| **not met** |") and "4 tokens, 4 distinct" in cold_tokens
    assert "`ovspec-cold`: 0/3 runs' full token lists equal genai's first run's" in text
    assert "first difference at token 3" in text
    # The first token: warm is 2x genai's, so its target is missed by the whole interval.
    warm_start = next(x for x in text.splitlines() if x.startswith("| warm spawn → first token"))
    assert warm_start.endswith("| **not met** |")
    assert "`tiny`: decode ≤ 1.10× genai in every band (`ovspec-warm`) **not met**" in text


def test_results_with_token_heads_only_never_claim_equal_tokens() -> None:
    from ovspec.bench.speed.page import render_page

    runs = []
    for rep in range(2):
        for arm in ("genai", "ovspec-warm"):
            r = run(arm, [1.0, 1.01, 1.02, 1.03], [], rep)
            del r["token_ids"]
            r["token_ids_head"] = [7, 9, 9, 9]
            runs.append(r)
    text = render_page(_case(runs, 2, [[2, 5]]) | {"command": "old"})
    assert "kept only each run's first tokens" in text and "2 distinct" in text
    line = next(
        x for x in text.splitlines() if x.startswith("| tokens equal genai's (`ovspec-warm`)")
    )
    assert line.endswith("| **not established** |")


def test_paired_ratios_cancel_a_drift_shared_within_a_repetition() -> None:
    # The VM runs at another speed in each repetition; ovspec takes 1.19-1.21x genai's
    # time within each. Steps of 10 ms x drift (genai) and x drift x ratio (ovspec).
    drifts, ratios = [1.0, 1.6, 0.7, 1.3], [1.19, 1.21, 1.2, 1.2]
    runs = []
    for rep, (drift, ratio) in enumerate(zip(drifts, ratios, strict=True)):
        for arm, scale in (("genai", drift), ("ovspec-eager", drift * ratio)):
            times = [1.0 + 0.01 * scale * i for i in range(5)]
            runs.append(run(arm, times, [5, 6, 7, 8, 9], rep))
    paired = paired_band_ratios(runs, "ovspec-eager", 2, [(2, 6)])["2-6"]
    assert paired is not None
    assert paired["per_repetition"] == pytest.approx(ratios)
    assert paired["ratio"] == pytest.approx(1.2, abs=0.002)
    assert paired["ci"][0] < 1.2 < paired["ci"][1] and paired["ci"][1] - paired["ci"][0] < 0.05
    # A band nobody reached, or one repetition only, gives no interval.
    assert paired_band_ratios(runs, "ovspec-eager", 2, [(50, 60)])["50-60"] is None
    assert paired_band_ratios(runs[:2], "ovspec-eager", 2, [(2, 6)])["2-6"] is None


def test_the_compared_runs_of_a_repetition_are_adjacent_and_take_turns_first() -> None:
    labels = ["genai", "ovspec-paged", "genai-sdpa", "llama.cpp"]
    side = ["genai-sdpa", "llama.cpp"]
    orders = [run_order(labels, rep, side) for rep in range(4)]
    for order in orders:
        at = sorted(order.index(a) for a in ("genai", "ovspec-paged"))
        assert at[1] - at[0] == 1 and sorted(order) == sorted(labels)
    firsts = [next(a for a in o if a not in side) for o in orders]
    assert firsts.count("genai") == firsts.count("ovspec-paged") == 2
    # No side arms: three arms take every order in six repetitions.
    assert len({tuple(run_order(["a", "b", "c"], rep)) for rep in range(6)}) == 6


def test_config_refuses_what_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="exceed the top rung"):
        SpeedConfig("builtin:tiny", tmp_path, Ladder((32, 64)), prompt_tokens=16, new_tokens=60)
    with pytest.raises(BadRequestError, match="--arms"):
        SpeedConfig("builtin:tiny", tmp_path, arms=("ovspec-warm",))
    with pytest.raises(BadRequestError, match="not a checkout of ovspec"):
        SpeedConfig("builtin:tiny", tmp_path, against=tmp_path)


def test_a_tiny_run_renders_its_page(tmp_path: Path) -> None:
    # The ovspec arms run again from another checkout (here a copy of this one).
    package = Path(ovspec.__file__).resolve().parent
    base = tmp_path / "base"
    shutil.copytree(package, base / "ovspec", ignore=shutil.ignore_patterns("__pycache__"))
    config = SpeedConfig(
        "builtin:tiny",
        tmp_path / "work",
        Ladder((32, 64)),
        prompt_tokens=8,
        new_tokens=30,
        repetitions=1,
        arms=("genai", "ovspec-warm", "ovspec-eager"),
        prefill_chunk_tokens=8,
        against=base,
    )
    results = run_speed(config, EXACT_CPU_PROPERTIES)
    assert "summary" not in results  # the page computes its figures from the runs
    tokens = {r["arm"]: r["token_ids"] for r in results["runs"]}
    assert all(len(ids) == 30 for ids in tokens.values())  # full lists kept
    assert tokens["ovspec-warm"] == tokens["genai"] == tokens["ovspec-warm@base"]
    ran_from = {r["arm"]: Path(r["ovspec_dir"]) for r in results["runs"]}
    assert ran_from == {
        "genai": package,
        "ovspec-warm": package,
        "ovspec-eager": package,
        "ovspec-warm@base": (base / "ovspec").resolve(),
        "ovspec-eager@base": (base / "ovspec").resolve(),
    }
    results["command"] = "python tools/bench_speed.py --model builtin:tiny"
    page = write_page(tmp_path / "pages", PAGE, results)
    text = page.read_text(encoding="utf-8")
    assert "| `ovspec-warm` |" in text and "### Targets (issue 9)" in text
    assert "`ovspec-warm`: 1/1 runs' full token lists equal genai's first run's (30 tokens" in text
    # One crossing (32 -> 64) per run: its step, the median over runs and the slowest.
    assert re.search(r"^\| `ovspec-eager` \|.* \| \d+ \(max \d+\) \|$", text, re.MULTILINE)
    assert "| `ovspec-warm@base` |" in text and f"from {base}" in text
    # Arms start from compiled bytecode, as an installed package does (genai's is).
    compiled = results["config"]["own_bytecode"]
    assert ("compiled to bytecode before the runs" in text) is compiled
    speed_source = Path(ovspec.__file__).parent / "bench" / "speed" / "arm.py"
    cached = Path(importlib.util.cache_from_source(str(speed_source)))
    assert compiled is cached.is_file()
    assert render_saved(tmp_path / "pages", PAGE) == text  # the page is its results, rendered


def test_memory_sampler_walks_page_tables_only_as_memory_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PSS (a page-table walk, ~22 ms at 3 GiB) is read when the resident set grew by a
    step since the last reading, not at every 50 ms sample; the peaks follow growth.
    The process's counters are scripted: other threads of the test run move the real
    ones."""
    status = {"RssAnon": 500.0, "RssFile": 300.0, "RssShmem": 0.0}
    pss = [700.0]
    monkeypatch.setattr(speed_arm, "_status_mib_fields", lambda *fields: dict(status))

    def read_pss(self: MemorySampler) -> None:
        self.pss_reads += 1
        self.peak_pss_mib = max(self.peak_pss_mib, pss[0])

    monkeypatch.setattr(MemorySampler, "read_pss", read_pss)
    sampler = MemorySampler()
    sampler.sample()
    assert sampler.pss_reads == 1 and sampler.peak_pss_mib == 700.0
    status["RssAnon"] += sampler.PSS_STEP_MIB / 2  # growth below a step: no walk
    sampler.sample()
    assert sampler.pss_reads == 1 and sampler.peak_anon_mib == 500.0 + sampler.PSS_STEP_MIB / 2
    status["RssAnon"] += sampler.PSS_STEP_MIB  # a step above the last walk
    pss[0] += 1.5 * sampler.PSS_STEP_MIB
    sampler.sample()
    assert sampler.pss_reads == 2
    assert sampler.peak_anon_mib == 500.0 + 1.5 * sampler.PSS_STEP_MIB
    assert sampler.peak_pss_mib == 700.0 + 1.5 * sampler.PSS_STEP_MIB
    status["RssAnon"] = 100.0  # shrinking lowers no peak, walks nothing
    sampler.sample()
    assert sampler.pss_reads == 2 and sampler.peak_anon_mib == 500.0 + 1.5 * sampler.PSS_STEP_MIB


def test_memory_sampler_reads_this_process() -> None:
    sampler = MemorySampler()
    block = np.ones(int(2 * sampler.PSS_STEP_MIB * 2**20) // 8)  # touched: resident
    sampler.sample()
    sampler.stop()  # a last sample and a last walk
    assert sampler.pss_reads >= 1
    assert sampler.peak_anon_mib >= 2 * sampler.PSS_STEP_MIB
    assert sampler.peak_pss_mib >= 2 * sampler.PSS_STEP_MIB
    del block


def test_an_arm_that_ran_another_checkout_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the working folder kept off sys.path (PYTHONSAFEPATH), a run meant for
    another checkout imports this one: refused, not a tree compared with itself."""
    base = tmp_path / "base"
    package = Path(ovspec.__file__).resolve().parent
    shutil.copytree(package, base / "ovspec", ignore=shutil.ignore_patterns("__pycache__"))
    model = materialize("builtin:tiny", tmp_path / "work")
    request = ArmRequest("genai", str(model), (5, 6, 7), 2, dict(EXACT_CPU_PROPERTIES))
    assert Path(_spawn(request, tmp_path, base)["ovspec_dir"]) == (base / "ovspec").resolve()
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    with pytest.raises(TrialError, match="ran ovspec from"):
        _spawn(request, tmp_path, base)


def test_an_older_checkout_runs_its_own_arm_module(tmp_path: Path) -> None:
    """``against`` may name a checkout from before the benchmarks had folders: its arm is
    ``ovspec.bench.speed_arm``; this checkout's is ``ovspec.bench.speed.arm``."""
    this = Path(ovspec.__file__).resolve().parents[1]
    assert arm_module(this) == "ovspec.bench.speed.arm"
    old = tmp_path / "old" / "ovspec" / "bench"
    old.mkdir(parents=True)
    (old / "speed_arm.py").write_text("")
    assert arm_module(tmp_path / "old") == "ovspec.bench.speed_arm"


def test_the_tool_runs_a_tiny_case_and_writes_its_page(tmp_path: Path) -> None:
    """tools/bench_speed.py end to end on the tiny preset: full token lists saved, the
    page rendered from them (structure only: no figure is checked)."""
    import json
    import subprocess
    import sys

    tool = Path(__file__).resolve().parents[2] / "tools" / "bench_speed.py"
    out = subprocess.run(
        [sys.executable, str(tool), "--model", "builtin:tiny", "--ladder", "32,64",
         "--prompt-tokens", "8", "--new-tokens", "30", "--repetitions", "2",
         "--arms", "genai,ovspec-paged", "--work-dir", str(tmp_path / "work"),
         "--out", str(tmp_path / "pages"), "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-800:]
    written = json.loads(out.stdout)
    results = json.loads(Path(written["results"]).read_text(encoding="utf-8"))
    assert results["format"] == 2 and results["case_order"] == ["builtin:tiny"]
    runs = results["cases"]["builtin:tiny"]["runs"]
    assert sorted(r["arm"] for r in runs) == ["genai", "genai", "ovspec-paged", "ovspec-paged"]
    assert all(len(r["token_ids"]) == 30 for r in runs)
    text = Path(written["page"]).read_text(encoding="utf-8")
    assert "| full token lists equal genai's (`ovspec-paged`) | 2/2 runs, 30 tokens" in text
    assert "| warm spawn → first token ≤ genai's (`ovspec-paged`) |" in text
    assert render_saved(tmp_path / "pages", PAGE) == text
