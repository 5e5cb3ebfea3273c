"""The chat benchmark's run: for each repetition both arms in fresh processes on the
same IR and the same token ids, in lockstep (``common.lockstep``): both loaded side by
side, then their turns alternate one process at a time (A B, B A, ... across turns: ABBA),
so a turn's two first tokens are measured seconds apart; the results document keeps every
sample, and ``chat.page`` decides the verdicts from them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.common.lockstep import LockstepArm, run_lockstep
from ovspec.bench.common.models import real_text_prompt, smollm2_gguf
from ovspec.bench.speed.runner import materialize
from ovspec.errors import BadRequestError

PAGE = "chat"
SMOLLM2 = "smollm2"
ARMS = ("genai", "ovspec")
PROTOCOL = "lockstep"  # results from before it ran each arm's whole chat in turn
HOME = Path(__file__).resolve().parents[3]  # the checkout the arms run from


@dataclass(frozen=True)
class ChatConfig:
    """One model's chat: a system prompt, ``turns`` user messages of ``user_tokens`` and
    answers of ``answer_tokens`` (greedy, EOS ignored), over ``ladder``."""

    model: str  # SMOLLM2 or a model reference (a folder, builtin:PRESET)
    ladder: str
    system_tokens: int = 1000
    turns: int = 10
    user_tokens: int = 40
    answer_tokens: int = 60
    repetitions: int = 3
    chunk_tokens: int = 512
    # After its load and each turn an arm idles this long, alone, before it stops: the
    # time a person reads and types, which deferred work (either arm's) may use.
    idle_s: float = 0.5

    def __post_init__(self) -> None:
        if min(self.system_tokens, self.turns, self.user_tokens, self.answer_tokens) < 1:
            raise BadRequestError("system, turns, user and answer tokens must be at least 1")
        if self.repetitions < 1:
            raise BadRequestError("--repetitions must be at least 1")
        if not 0.0 <= self.idle_s <= 60.0:
            raise BadRequestError("--idle-s must be between 0 and 60 seconds")


def conversation_ids(config: ChatConfig, model_dir: Path, vocab_tokens: int) -> dict[str, Any]:
    """The system prompt's and each message's ids: real text through the model's
    tokenizer where it has one, else seeded ids (a built-in preset)."""
    total = config.system_tokens + config.turns * config.user_tokens
    if (model_dir / "openvino_tokenizer.xml").is_file():
        ids = list(real_text_prompt(model_dir, total))
    else:
        ids = [int(t) for t in np.random.default_rng(0).integers(3, vocab_tokens, total)]
    system = ids[: config.system_tokens]
    rest = ids[config.system_tokens :]
    users = [
        rest[i * config.user_tokens : (i + 1) * config.user_tokens] for i in range(config.turns)
    ]
    return {"system_ids": system, "user_ids": users}


def run_chat(
    config: ChatConfig,
    work_dir: Path,
    properties: Mapping[str, str],
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    say = on_progress or (lambda _m: None)
    began = time.perf_counter()
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    model = str(smollm2_gguf(work_dir)) if config.model == SMOLLM2 else config.model
    model_dir = materialize(model, work_dir)
    vocab = int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 1000))
    request: dict[str, Any] = {
        **conversation_ids(config, model_dir, vocab),
        "model_dir": str(model_dir),
        "ladder": config.ladder,
        "answer_tokens": config.answer_tokens,
        "chunk_tokens": config.chunk_tokens,
        "idle_s": config.idle_s,
        "store": str(work_dir / "store"),
        "properties": dict(properties),
    }
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    schedules = []
    for repetition in range(config.repetitions):
        order = ARMS if repetition % 2 == 0 else ARMS[::-1]
        say(f"repetition {repetition + 1}/{config.repetitions} in lockstep: {', '.join(order)}")
        arms = [LockstepArm(arm, _argv({**request, "arm": arm}), HOME) for arm in order]
        found = run_lockstep(arms, 1)  # a block: one turn (or an arm's load, or its end)
        for arm in ARMS:
            runs[arm].append(_result(arm, found.arms[arm]))
        schedules.append(found.schedule)
    return {
        "config": {**asdict(config), "protocol": PROTOCOL},
        "model_dir": str(model_dir),
        "runs": runs,
        "schedules": schedules,
        "wall_s": time.perf_counter() - began,
        "properties": dict(properties),
    }


def _argv(request: Mapping[str, Any]) -> Callable[[float], list[str]]:
    text = json.dumps(request)
    return lambda _spawn_s: [sys.executable, "-m", "ovspec.bench.chat.arm", text]


def _result(arm: str, record: Mapping[str, Any]) -> dict[str, Any]:
    lines = record["stdout"].strip().splitlines()
    if record["returncode"] != 0 or not lines:
        tail = (record["stderr_tail"].strip().splitlines() or ["no output"])[-1]
        raise BadRequestError(f"the {arm} arm failed: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
