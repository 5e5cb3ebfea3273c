"""The NPU-plugin benchmark's cases and their run: each case is a speed run (a fresh
process per arm, interleaved, paired by repetition) of genai's NPU pipeline, with and
without its generate pyramid, and ovspec one-ahead, all on ``--device NPU`` with
``NPUW_DEVICES=CPU``, under an emulated device/host core split or on shared cores;
``npu.page`` renders the document into docs/benchmarks/npu-plugin.md (split) or
npu-plugin-shared-cores.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.bench.speed.runner import (
    SpeedConfig,
    cases_document,
    npu_context_properties,
    prefixed,
    run_speed,
)
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder

PAGE = "npu-plugin"  # under the device/host split
SHARED_CORES_PAGE = "npu-plugin-shared-cores"  # every arm on every core
# History: 1 — first format (2026-12); 2 — the split ("split": its cores, or null), and
# per run under it "decode_cpu_s" (2026-12-03).
RESULTS_FORMAT = 2
REFERENCE_ARM = "genai-npu"
OVSPEC_ARM = "ovspec-npu"
# The warm pair: ovspec's store and genai's CACHE_DIR primed before the repetitions.
CACHED_REFERENCE_ARM = "genai-npu-cached"
OVSPEC_WARM_ARM = "ovspec-npu-warm"
NPU_ARMS = (REFERENCE_ARM, "genai-npu-pyramid", OVSPEC_ARM, CACHED_REFERENCE_ARM, OVSPEC_WARM_ARM)
# Given to every arm so genai runs ovspec's numerics: f32 on the subdevice and between
# NPUW's partitions (the NPUW profile's exact properties; NPUW_F16IC's default, f16
# links, changed ovspec's token 352 of small-96). Not the profile's NPUW_FOLD=NO, except
# where a case adds it: with it genai's NPU pipeline fails on the 0.5B preset (NPUW's
# partitioner, on the lm_head tied to the embedding).
SHARED_NPUW_PROPERTIES: Mapping[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "NPUW_F16IC": "NO",
}


@dataclass(frozen=True)
class NpuCase:
    """One model, prompt length, generated tokens and ladder."""

    name: str
    model: str  # a builtin:PRESET or an IR folder
    prompt_tokens: int
    new_tokens: int
    ladder: str
    # Properties this case adds for every arm, over the run's.
    extra_properties: tuple[tuple[str, str], ...] = ()
    # What the case stands for, in a sentence the page shows ("" none).
    scenario: str = ""

    def __post_init__(self) -> None:
        # Refused here, before any run: genai's context must fit the ladder's top.
        npu_context_properties(self.prompt_tokens, Ladder.parse(self.ladder))


CASES: dict[str, NpuCase] = {
    c.name: c
    for c in (
        # builtin:small decodes in milliseconds here: cheap, every rung crossed.
        NpuCase(
            "small-96",
            "builtin:small",
            96,
            400,
            "128,256,512",
            (),  # NPUW_FOLD=NO until the embedding was cut (docs/npu.md)
            "the answer nearly fills the configured maximum context (496 of 512 tokens).",
        ),
        NpuCase(
            "small-96-max1024",
            "builtin:small",
            96,
            400,
            "128,256,512,1024",
            (),
            "a user configures a maximum context of 1024 tokens (genai's MAX_PROMPT_LEN + "
            "MIN_RESPONSE_LEN, ovspec's top rung) and the answer stops at 496 tokens, "
            "before half of it: genai reserves the 1024 from the start, ovspec grows "
            "rung by rung and stops at 512.",
        ),
        # The 0.5B-shaped preset: 15-40 s to a cold first token and 0.3-2 s per token on
        # NPUW over 2 cores (docs/benchmarks/npu-plugin.md), so 64 tokens, across one
        # boundary (128): about 5 min a repetition of the three arms.
        NpuCase("qwen0.5b-96", "builtin:qwen2.5-0.5b", 96, 64, "128,256"),
        NpuCase(
            "qwen0.5b-96-max1024",
            "builtin:qwen2.5-0.5b",
            96,
            64,
            "128,256,512,1024",
            (),
            "a user configures a maximum context of 1024 tokens and the answer stops at "
            "160: genai reserves the 1024 from the start (and its generate graph attends "
            "over it), ovspec decodes on 128 then 256 while one-ahead builds the next rung.",
        ),
    )
}
DEFAULT_CASES = ("small-96", "small-96-max1024", "qwen0.5b-96", "qwen0.5b-96-max1024")


def run_npu(
    work_dir: Path,
    cases: Sequence[NpuCase],
    repetitions: int,
    properties: Mapping[str, str] = SHARED_NPUW_PROPERTIES,
    arms: Sequence[str] = NPU_ARMS,
    prefill_chunk_tokens: int = 128,
    split: CoreSplit | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every case's speed run; returns the results document (each case's runs whole,
    with genai's NPU context, the KV it reserves, beside them). ``split``: every arm's
    inference on its device cores, its compiles on its host cores (None: shared)."""
    say = on_progress or (lambda _m: None)
    if not cases:
        raise BadRequestError("no cases to run")
    began = time.perf_counter()
    work_dir = work_dir.resolve()
    out: dict[str, Any] = {}
    for case in cases:
        ladder = Ladder.parse(case.ladder)
        config = SpeedConfig(
            model=case.model,
            work_dir=work_dir,
            ladder=ladder,
            prompt_tokens=case.prompt_tokens,
            new_tokens=case.new_tokens,
            repetitions=repetitions,
            arms=tuple(arms),
            prefill_chunk_tokens=prefill_chunk_tokens,
            split=_text(split),
        )
        say(f"case {case.name}: {', '.join(arms)}, {repetitions} repetitions")
        case_properties = {**properties, **dict(case.extra_properties)}
        results = run_speed(config, case_properties, prefixed(say, case.name))
        results["config"]["prompt_text"] = "random ids"
        results["config"]["scenario"] = case.scenario
        results["config"]["genai_context"] = npu_context_properties(case.prompt_tokens, ladder)
        out[case.name] = results
    return cases_document(
        out,
        began,
        properties,
        format=RESULTS_FORMAT,
        split=split.to_json() if split is not None else None,
    )


def _text(split: CoreSplit | None) -> str:
    """``split`` as ``CoreSplit.parse`` reads it ("" for none)."""
    if split is None:
        return ""
    return "/".join(",".join(str(c) for c in cores) for cores in (split.device, split.host))
