"""The long-context benchmark's decode runs in lockstep: per repetition, the compared
arms' processes (and the side peers' in the first repetitions) loaded side by side and
run in turns of a few tokens (``common.lockstep``); every arm's token times and ids, its
memory peak and its run windows kept whole for the page to pair the blocks.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.common.lockstep import LockstepArm, run_lockstep
from ovspec.bench.speed.arm import RESULT_PREFIX
from ovspec.bench.speed.runner import ARMS, SpeedConfig, arm_module, arm_request, materialize
from ovspec.errors import TrialError

HOME = Path(__file__).resolve().parents[3]  # the checkout the arms run from


def decode_order(compared: Sequence[str], side: Sequence[str], rep: int) -> list[str]:
    """Repetition ``rep``'s arms: the compared pair, reversed on odd repetitions (so
    each arm loads first and leads the ABBA rounds alike), then the side peers."""
    pair = list(compared) if rep % 2 == 0 else list(compared)[::-1]
    return pair + list(side)


def run_decode_lockstep(
    config: SpeedConfig,
    properties: Mapping[str, str],
    compared: Sequence[str],
    block_tokens: int,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """``config.repetitions`` lockstep runs of ``compared`` (plus ``config.side_arms`` in
    the first ``config.side_repetitions``); returns every arm's run, as the speed
    benchmark saves them, with its ``windows_s``."""
    work_dir = config.work_dir.resolve()
    model_dir = materialize(config.model, work_dir)
    rng = np.random.default_rng(config.seed)  # the prompt run_speed draws with this seed
    prompt = config.prompt_ids or tuple(
        int(t) for t in rng.integers(100, 2000, config.prompt_tokens)
    )
    side = [a for a in config.arms if a in config.side_arms]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ovspec-long-") as scratch:
        folder = Path(scratch)
        for rep in range(config.repetitions):
            skip = config.side_repetitions is not None and rep >= config.side_repetitions
            labels = decode_order(compared, [] if skip else side, rep)
            arms = []
            for label in labels:
                arm = ARMS[label]
                store = work_dir / f"store-{label}" if arm.store == "kept" else None
                request = arm_request(config, properties, arm, model_dir, prompt, store)
                path = folder / f"request-{rep}-{label}.json"
                path.write_text(json.dumps(request.to_json()), encoding="utf-8")
                python = config.llamacpp_python if arm.runner == "llamacpp" else None
                arms.append(LockstepArm(label, _argv(python, path), HOME))
            say(f"repetition {rep + 1}/{config.repetitions} in lockstep: {', '.join(labels)}")
            found = run_lockstep(arms, block_tokens, say)
            for label in labels:
                record = found.arms[label]
                result = _result(label, record)
                runs.append(
                    {"arm": label, "repetition": rep, **result, "windows_s": record["windows_s"]}
                )
    for run in runs:
        run["tokens"] = len(run["token_ids"])
    return runs


def _argv(python: Path | None, request: Path) -> Callable[[float], list[str]]:
    interpreter = str(python or sys.executable)
    return lambda spawn_s: [interpreter, "-m", arm_module(HOME), str(request), repr(spawn_s)]


def _result(label: str, record: Mapping[str, Any]) -> dict[str, Any]:
    lines = record["stdout"].splitlines()
    line = next((x for x in lines if x.startswith(RESULT_PREFIX)), None)
    if record["returncode"] != 0 or line is None:
        raise TrialError(
            f"{label} run failed (exit {record['returncode']}): {record['stderr_tail']}"
        )
    result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
    return result
