"""The lockstep protocol: arms take turns in ABBA blocks, exactly one running at a time
(real child processes, stopped between their blocks), and the block statistics leave the
first step after a resume out, pair blocks of one round and widen the interval for
serially correlated blocks."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import pytest

from ovspec.bench.common.lockstep import ENV_FD, LockstepArm, round_order, run_lockstep
from ovspec.bench.common.lockstep_stats import (
    block_rates,
    in_band,
    lag1_autocorrelation,
    lockstep_ratio,
    paired_blocks,
)
from ovspec.bench.speed.arm import LOCKSTEP_FD_ENV
from ovspec.errors import TrialError

REPO = Path(__file__).resolve().parents[2]
# A child arm: ``tokens`` steps of ``step_s`` each, reported per token; prints its token
# times (relative to the spawn time it is given) as its last line.
CHILD = """
import json, sys, time
from ovspec.bench.common.lockstep import token_reporter
spawn, tokens, step = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
report = token_reporter()
times = []
for _ in range(tokens):
    end = time.time() + step
    while time.time() < end:  # busy: a stopped process would not advance this
        pass
    times.append(time.time() - spawn)
    report()
print(json.dumps(times))
"""


def _arm(label: str, tokens: int, step_s: float) -> LockstepArm:
    return LockstepArm(
        label,
        lambda spawn: [sys.executable, "-c", CHILD, repr(spawn), str(tokens), str(step_s)],
        REPO,
    )


def test_arms_take_turns_in_abba_blocks_one_at_a_time() -> None:
    # A step of 20 ms: the coordinator stops an arm after reading its block's last token,
    # and a busy CI machine may take a few ms to (a shorter step let a seventh slip in).
    found = run_lockstep([_arm("a", 25, 0.02), _arm("b", 25, 0.02)], block_tokens=6)
    assert found.schedule[:8] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    spans = []
    for label, record in found.arms.items():
        assert record["returncode"] == 0, record["stderr_tail"]
        times = json.loads(record["stdout"].splitlines()[-1])
        windows = record["windows_s"]
        assert len(times) == 25  # the first token alone, then blocks of 6 (and its exit)
        # Every token after the first was made while its arm was let run.
        assert all(any(lo < t <= hi for lo, hi in windows) for t in times[1:]), label
        counts = [sum(lo < t <= hi for t in times) for lo, hi in windows]
        assert counts[:4] == [6, 6, 6, 6] and sum(counts) == 24, label
        spans += [(lo + record["spawn_s"], hi + record["spawn_s"]) for lo, hi in windows]
    spans.sort()
    # No overlap (windows are saved to 10 us).
    assert all(a[1] <= b[0] + 2e-5 for a, b in itertools.pairwise(spans))


def test_an_arm_that_fails_is_reported_and_the_other_goes_on() -> None:
    broken = LockstepArm("broken", lambda _s: [sys.executable, "-c", "raise SystemExit(3)"])
    found = run_lockstep([broken, _arm("b", 8, 0.001)], block_tokens=4)
    assert found.arms["broken"]["returncode"] == 3
    assert found.arms["b"]["returncode"] == 0
    assert set(found.schedule) == {"b"}
    with pytest.raises(TrialError, match="distinct arms"):
        run_lockstep([broken, broken], block_tokens=4)


def test_the_speed_arm_reads_the_coordinators_pipe_by_its_name() -> None:
    """The speed arm checks the variable without importing the coordinator (genai's
    arm imports no more of ovspec than it must): the two names must agree."""
    assert LOCKSTEP_FD_ENV == ENV_FD


def test_round_order_reverses_every_other_round() -> None:
    assert [round_order(["a", "b", "c"], r) for r in range(3)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]


def test_a_block_leaves_out_the_first_step_after_its_resume() -> None:
    # Steps of 10 ms, a 500 ms pause before token 3; the window opens during the pause.
    times = [0.01, 0.02, 0.52, 0.53, 0.54, 0.55]
    first, empty = block_rates(times, [[0.1, 0.55], [0.6, 0.7]])
    assert first is not None and first[1] == pytest.approx(10.0) and first[0] == 3.5
    assert empty is None  # no tokens: no rate, the index kept for pairing


def test_blocks_pair_by_round_and_fall_in_the_band_of_their_middle_token() -> None:
    pairs = paired_blocks([(2.0, 10.0), None, (10.0, 12.0)], [(2.0, 11.0), (6.0, 9.0), (10.0, 6.0)])
    assert pairs == [(2.0, 10.0, 11.0), (10.0, 12.0, 6.0)]
    assert in_band(pairs, 100, (100, 105)) == [(10.0, 11.0)]
    assert in_band(pairs, 100, (105, 200)) == [(12.0, 6.0)]


def test_correlated_blocks_widen_the_batch_interval_and_a_slower_arm_fails() -> None:
    # Log ratios drifting slowly around 1.2×: block pairs look precise, batches do not.
    drift = [0.18 + 0.05 * math.sin(i / 6) for i in range(48)]
    run = [(10.0, 10.0 * math.exp(x)) for x in drift]
    ratio = lockstep_ratio([run, run[::-1]], batch_pairs=4)
    assert ratio.pairs == 96 and ratio.batch_count == 24 and ratio.run_count == 2
    assert ratio.blocks is not None and ratio.batches is not None
    assert ratio.batches.high - ratio.batches.low > ratio.blocks.high - ratio.blocks.low
    assert ratio.lag1 is not None and ratio.lag1 > 0.8
    chosen, runs = ratio.verdict_interval, ratio.runs
    assert chosen is not None and runs is not None  # both intervals held: the wider ends
    assert chosen.low == min(ratio.batches.low, runs.low)
    assert chosen.high == max(ratio.batches.high, runs.high)
    assert ratio.batches.low > 1.1  # a 1.2× slower arm misses a 1.10 target
    assert lag1_autocorrelation([[1.0, 1.0]]) is None
    # Neighbours within a run only: two runs of alternating values are anticorrelated.
    assert lag1_autocorrelation([[1.0, -1.0, 1.0], [5.0, 3.0, 5.0]]) == pytest.approx(-2 / 3)


def test_an_incomplete_batch_joins_the_one_before() -> None:
    ratio = lockstep_ratio([[(1.0, 2.0)] * 6, [(1.0, 1.0)] * 3], batch_pairs=4)
    assert ratio.batch_count == 2  # 6 pairs: one batch of 6; 3 pairs: one batch of 3


def test_arms_that_stop_themselves_between_turns_alternate_turn_by_turn() -> None:
    """``checkpoint`` arms (the chat's): loaded, then one turn per block, ABBA."""
    child = (
        "import json, sys, time\n"
        "from ovspec.bench.common.lockstep import checkpoint\n"
        "checkpoint()\n"
        "began = []\n"
        "for _ in range(4):\n"
        "    began.append(time.time())\n"
        "    checkpoint()\n"
        "print(json.dumps(began))\n"
    )
    arms = [LockstepArm(x, lambda _s: [sys.executable, "-c", child], REPO) for x in "ab"]
    found = run_lockstep(arms, 1)
    assert found.schedule[:8] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    starts = {x: json.loads(found.arms[x]["stdout"].splitlines()[-1]) for x in "ab"}
    # Turn i of one arm began after turn i - 1 of both: they alternate, none skipped.
    for i in range(1, 4):
        assert min(starts["a"][i], starts["b"][i]) > max(starts["a"][i - 1], starts["b"][i - 1])


def test_an_arm_idles_alone_after_its_turn_before_it_stops() -> None:
    """``checkpoint(idle_s)``: the next arm starts only after this one's idle time."""
    child = (
        "import json, sys, time\n"
        "from ovspec.bench.common.lockstep import checkpoint\n"
        "checkpoint(0.3)\n"
        "marks = []\n"
        "for _ in range(2):\n"
        "    began = time.time()\n"
        "    marks.append((began, time.time()))\n"
        "    checkpoint(0.3)\n"
        "print(json.dumps(marks))\n"
    )
    arms = [LockstepArm(x, lambda _s: [sys.executable, "-c", child], REPO) for x in "ab"]
    found = run_lockstep(arms, 1)
    marks = {x: json.loads(found.arms[x]["stdout"].splitlines()[-1]) for x in "ab"}
    # Turn 1 runs a then b (after both loads): b's begins 0.3 s or more after a's ended,
    # and turn 2 runs b then a: a's begins 0.3 s or more after b's ended.
    assert found.schedule[:4] == ["a", "b", "b", "a"]
    assert marks["b"][0][0] - marks["a"][0][1] >= 0.3
    assert marks["a"][1][0] - marks["b"][1][1] >= 0.3
