"""docs/benchmarks/chat.md, rendered from the chat benchmark's results: per turn the
first token of each arm, and four verdicts decided by the 95% interval's bound over the
repetitions (met: the bound clears the target; missed: the whole interval is past it;
else undecided), every sample kept in the results file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from ovspec.bench.common.lockstep_stats import LockstepRatio, lockstep_ratio
from ovspec.bench.common.verdicts import Interval

CONFIDENCE = 0.95
TTFT_TARGET = 1.0  # ovspec's first token per turn, from turn 2 on, over genai's
PREFIX_TARGET = 0.2  # a prefix hit's first token over a cold prefill of the system prompt
TURN_BATCH_PAIRS = 3  # turns per batch mean in lockstep results (shown, not the verdict's)
LOCKSTEP = (
    "both arms' processes loaded side by side, then their turns alternating, exactly one "
    "process running (the other stopped by SIGSTOP after its turn), the order reversed "
    "every turn (ABBA), so a turn's two first tokens are seconds apart and paired"
)
GENAI_ARM = (
    "`LLMPipeline` (its default CPU backend: continuous batching, prefix cache on) given the "
    "whole conversation's token ids each turn; that backend keeps no history for token ids: "
    "its prefix cache finds the earlier turns' KV blocks and it prefills what they do not "
    "hold."
)
GENAI_ARM_BEFORE = (
    "`LLMPipeline` start_chat / generate(this turn's token ids) / finish_chat. Its default "
    "CPU backend (continuous batching) keeps no chat history for token ids: from turn 2 on "
    "it answered each turn's own tokens as a new conversation, so its first token (a "
    "prefill over no past) and its answers are not comparable with ovspec's."
)


def interval(samples: Sequence[float]) -> tuple[float, float, float] | None:
    """Mean and its 95% t interval; None with fewer than two samples."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size < 2:
        return None
    mean = float(values.mean())
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, values.size - 1) * values.std(ddof=1))
    half /= math.sqrt(values.size)
    return mean, mean - half, mean + half


def verdict(samples: Sequence[float], target: float) -> str:
    found = interval(samples)
    if found is None:
        return "undecided (one sample)"
    _, low, high = found
    if high <= target:
        return "met"
    if low > target:
        return "missed"
    return "undecided"


def ttft_ratios(results: Mapping[str, Any]) -> list[float]:
    """Per repetition: ovspec's mean first token over turns 2.. divided by genai's."""
    out = []
    for ours, theirs in zip(results["runs"]["ovspec"], results["runs"]["genai"], strict=True):
        a = [t["first_token_s"] for t in ours["turns"][1:]]
        b = [t["first_token_s"] for t in theirs["turns"][1:]]
        out.append(float(np.mean(a) / np.mean(b)) if a and b else math.nan)
    return out


def is_lockstep(results: Mapping[str, Any]) -> bool:
    """Whether the arms ran in lockstep (results from before it ran each arm's whole
    chat in turn, and pair the repetitions' means)."""
    return bool(results["config"].get("protocol") == "lockstep")


def turn_ratio(results: Mapping[str, Any]) -> LockstepRatio:
    """ovspec's first token over genai's, paired within each turn from turn 2 on (the
    two measured seconds apart in lockstep): one mean per run is the verdict's interval
    (turns of one run are serially correlated); turn pairs as independent beside it."""
    pairs = [
        [
            (b["first_token_s"], a["first_token_s"])
            for a, b in zip(ours["turns"][1:], theirs["turns"][1:], strict=True)
        ]
        for ours, theirs in zip(results["runs"]["ovspec"], results["runs"]["genai"], strict=True)
    ]
    return lockstep_ratio(pairs, TURN_BATCH_PAIRS)


def genai_given_history(results: Mapping[str, Any]) -> bool:
    """Whether genai's arm was given the whole conversation each turn (its turns record the
    prompt's length). Results from before 2026-12-03 gave it each turn's own ids only,
    which its continuous-batching backend answers with no history at all."""
    return all("prompt_tokens" in t for r in results["runs"]["genai"] for t in r["turns"])


def first_differences(results: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Per repetition where genai's answers first differ from ovspec's: (turn, token),
    both from 1; none where every answer is the same."""
    out = []
    for ours, theirs in zip(results["runs"]["ovspec"], results["runs"]["genai"], strict=True):
        for turn, (a, b) in enumerate(zip(ours["turns"], theirs["turns"], strict=True), 1):
            x, y = a["token_ids"], b["token_ids"]
            if x != y:
                token = next(
                    (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                    min(len(x), len(y)),
                )
                out.append((turn, token + 1))
                break
    return out


def prefix_ratios(results: Mapping[str, Any]) -> list[float]:
    runs = results["runs"]["ovspec"]
    return [r["prefix_hit_first_token_s"] / r["cold_system_prefill_s"] for r in runs]


def _cell(samples: Sequence[float]) -> str:
    found = interval(samples)
    if found is None:
        return f"{samples[0]:.3f}" if samples else "n/a"
    mean, low, high = found
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def render(results: Mapping[str, Any]) -> str:
    """The page: every model's case (``cases`` in ``case_order``), each from its runs."""
    lines = [
        "# Chat: a kept conversation against genai's chat mode",
        "",
        f"Generated by `{results['command']}` from `results/chat.json`; do not edit.",
        "",
    ]
    for name in results["case_order"]:
        lines += [f"## {name}", "", *_case(results["cases"][name])]
    return "\n".join(lines)


def _differences(found: Sequence[tuple[int, int]]) -> str:
    if not found:
        return "."
    where = ", ".join(f"turn {t} token {k}" for t, k in sorted(set(found)))
    return (
        f"; first different token: {where}. Both arms are given the same tokens; where "
        "they split them into different calls (genai prefills from where its cached blocks "
        "end, ovspec a turn's own tokens), a call reads earlier calls' K/V rounded to the "
        "u8 cache, which can flip a greedy near-tie; from there each arm's history holds its "
        "own answers, so its later turns differ too."
    )


def _case(results: Mapping[str, Any]) -> list[str]:
    config = results["config"]
    ours, theirs = results["runs"]["ovspec"], results["runs"]["genai"]
    refed = sum(t["earlier_refed_tokens"] for r in ours for t in r["turns"][1:])
    waits = [sum(t["boundary_wait_s"] for t in r["turns"]) for r in ours]
    ttft, prefix = ttft_ratios(results), prefix_ratios(results)
    same = sum(
        a["token_ids"] == b["token_ids"]
        for r, s in zip(ours, theirs, strict=True)
        for a, b in zip(r["turns"], s["turns"], strict=True)
    )
    fair = genai_given_history(results)
    ttft_verdict = verdict(ttft, TTFT_TARGET) if fair else "not comparable"
    ttft_cell, lockstep_note, ttft_how = _cell(ttft), list[str](), ""
    if is_lockstep(results):
        paired = turn_ratio(results)
        per_run = paired.runs
        ttft_cell = "n/a" if per_run is None else per_run.text(3)
        ttft_verdict = _interval_verdict(per_run, TTFT_TARGET) if fair else "not comparable"
        lockstep_note = _lockstep_note(paired)
        ttft_how = " (geometric mean of turn pairs, interval over runs)"
    lines = [
        f"Model `{config['model']}`, ladder {config['ladder']}, a {config['system_tokens']}-token "
        f"system prompt, {config['turns']} turns of {config['user_tokens']} tokens, answers of "
        f"{config['answer_tokens']} greedy tokens, {config['repetitions']} repetitions "
        f"({_protocol(results, config)})"
        ". ovspec: a `Conversation` on the paged "
        f"path; genai: {GENAI_ARM if fair else GENAI_ARM_BEFORE}",
        "",
        "| figure | value (mean [95% interval]) | target | verdict |",
        "|---|---|---|---|",
        f"| first token, turns 2+, ovspec / genai{ttft_how} | {ttft_cell} | <= {TTFT_TARGET} | "
        f"{ttft_verdict} |",
        f"| tokens of earlier turns prefilled again | {refed} | 0 | "
        f"{'met' if refed == 0 else 'missed'} |",
        f"| prefix hit's first token / cold system prefill | {_cell(prefix)} | <= {PREFIX_TARGET} "
        f"| {verdict(prefix, PREFIX_TARGET)} |",
        f"| boundary waits between turns (s, per run) | {max(waits):.3f} max | 0 | "
        f"{'met' if max(waits) == 0 else 'missed'} |",
        "",
        *lockstep_note,
        f"Answers identical to genai's: {same} of {sum(len(r['turns']) for r in ours)} turns"
        + (_differences(first_differences(results)) if fair else "."),
        "",
        "### First token per turn (s, median over repetitions)",
        "",
        "| turn | ovspec | genai | ovspec prefilled tokens | rung |"
        + (" genai prompt tokens |" if fair else ""),
        "|---|---|---|---|---|" + ("---|" if fair else ""),
    ]
    for i in range(config["turns"]):
        a = float(np.median([r["turns"][i]["first_token_s"] for r in ours]))
        b = float(np.median([r["turns"][i]["first_token_s"] for r in theirs]))
        turn = ours[0]["turns"][i]
        given = f" {theirs[0]['turns'][i]['prompt_tokens']} |" if fair else ""
        lines.append(
            f"| {i + 1} | {a:.3f} | {b:.3f} | {turn['prefilled_tokens']} | "
            f"{turn['capacity_tokens']} |{given}"
        )
    lines.append("")
    return lines


def _interval_verdict(found: Interval | None, target: float) -> str:
    if found is None:
        return "undecided (one sample)"
    if found.high <= target:
        return "met"
    if found.low > target:
        return "missed"
    return "undecided"


def _lockstep_note(paired: LockstepRatio) -> list[str]:
    """The turn-level figures behind the lockstep verdict, and how it was decided."""

    def text(found: Interval | None) -> str:
        return "n/a" if found is None else found.text(3)

    lag = "n/a" if paired.lag1 is None else f"{paired.lag1:.2f}"
    return [
        "First token, turns 2+, ovspec / genai: the geometric mean of the per-turn ratios "
        f"with 95% intervals: over {paired.run_count} runs (one mean each, the verdict's: "
        f"turns of one run are serially correlated) {text(paired.runs)}; over "
        f"{paired.batch_count} batch means of {TURN_BATCH_PAIRS} consecutive turns "
        f"{text(paired.batches)}; over {paired.pairs} turn pairs as if independent "
        f"{text(paired.blocks)}; lag-1 autocorrelation of the turns' log ratios {lag}.",
        "",
    ]


def _protocol(results: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """How the arms ran: lockstep (with the idle time after each turn, when there was
    one) or, in results from before it, each arm's whole chat in a fresh process."""
    if not is_lockstep(results):
        return "each arm a fresh process, order alternating"
    idle_s = float(config.get("idle_s", 0.0))
    if idle_s <= 0.0:
        return LOCKSTEP
    return (
        f"{LOCKSTEP}; after its load and each turn an arm idles {idle_s:g} s, still alone, "
        "before it stops: a person's reading time, which work either arm defers past a turn "
        "may use"
    )
