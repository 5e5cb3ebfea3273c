"""The long-context page's decode figures for results measured in lockstep (``protocol``
"lockstep" in a case's config): per band, each arm's ms per token from its blocks, the
ratio of paired blocks with its three intervals, and the words saying how they were
measured. Pure: recomputed from the saved token times and run windows.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.bench.common.lockstep_stats import (
    LockstepRatio,
    block_rates,
    in_band,
    lockstep_ratio,
    paired_blocks,
)
from ovspec.bench.common.verdicts import Interval

REFERENCE_ARM = "genai"


def is_lockstep(case: Mapping[str, Any]) -> bool:
    return bool(case["config"].get("protocol") == "lockstep")


def protocol_text(config: Mapping[str, Any]) -> str:
    """How a lockstep case was measured, for the page."""
    return (
        f"Spawn → first token: {config['first_token_pairs']} pairs of fresh processes "
        f"making {config['first_token_new_tokens']} tokens (genai and ovspec back to back, "
        "ABBA order), after one discarded warm-up run per arm. Decode and peak RSS: "
        f"{config['repetitions']} lockstep runs making {config['new_tokens']} tokens each: "
        "every arm's process loaded and run to its first token alone, then the arms take "
        f"turns of {config['block_tokens']} tokens, exactly one running (the others "
        "stopped with SIGSTOP: genai streams from a worker thread, so blocking its callback "
        "would not pause it), the order reversed every round (ABBA). A block's ms/token runs "
        "from its first token after the resume to its last, so the step in flight at the "
        "pause and the first step after it (cache warmth lost to the other arm) are left "
        "out, for every arm alike. A pair is genai's and ovspec's blocks of one round "
        "(adjacent in time, the same tokens); a band's ratio is the geometric mean of its "
        "pairs' ratios, a block counting in the band of its middle token. Blocks of one "
        "run are serially correlated and share whatever differs between a run's processes, "
        "so the verdict's 95% interval spans both a t interval over batch means of "
        f"{config['batch_pairs']} consecutive pairs within a run and a t interval over the "
        "runs (one mean per run): from the lower of their low ends to the higher of their "
        "high ends. The interval over block pairs as if independent is shown beside them "
        "(it is too narrow where neighbours correlate), with the lag-1 autocorrelation of "
        "the pairs' log ratios (within each run, centred on its mean). The side peers, where "
        f"present, run in the first {_side_runs(config)} of each and in none of the ratios. "
        "Peak RSS is each lockstep process's own VmHWM, paired by run"
    )


def _side_runs(config: Mapping[str, Any]) -> str:
    reps = config.get("side_repetitions")
    return "runs" if reps is None else f"{reps} runs"


def _rates(run: Mapping[str, Any]) -> list[tuple[float, float] | None]:
    return block_rates(run["token_s"], run["windows_s"])


def band_ms(run: Mapping[str, Any], prompt_tokens: int, band: Sequence[int]) -> float | None:
    """A lockstep run's mean block ms/token over the blocks whose middle token is in
    ``band`` (pauses left out)."""
    lo, hi = band
    rates = [r for r in _rates(run) if r is not None]
    kept = [ms for mid, ms in rates if lo <= prompt_tokens + mid - 1 < hi]
    return statistics.fmean(kept) if kept else None


def band_ratios(case: Mapping[str, Any], arm: str) -> dict[str, LockstepRatio]:
    """Per band ("lo-hi"), ``arm`` over genai from the lockstep runs' paired blocks."""
    config, runs = case["config"], case["runs"]
    by_rep: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in runs:
        by_rep.setdefault(int(r["repetition"]), {})[r["arm"]] = r
    pairs = [
        paired_blocks(_rates(reps[REFERENCE_ARM]), _rates(reps[arm]))
        for _, reps in sorted(by_rep.items())
        if REFERENCE_ARM in reps and arm in reps
    ]
    return {
        f"{lo}-{hi}": lockstep_ratio(
            [in_band(p, config["prompt_tokens"], (lo, hi)) for p in pairs], config["batch_pairs"]
        )
        for lo, hi in config["bands"]
    }


def summary(ratio: LockstepRatio) -> dict[str, Any] | None:
    """The verdict's interval as the page's summaries read it."""
    chosen = ratio.verdict_interval
    return None if chosen is None else {"ratio": chosen.estimate, "ci": [chosen.low, chosen.high]}


def _cell(interval: Interval | None) -> str:
    return "–" if interval is None else interval.text(2, "×")


def intervals_table(case: Mapping[str, Any], arm: str) -> list[str]:
    """Per band: pairs, batches, runs and the three intervals of ``arm`` over genai."""
    lines = [
        f"Decode ratios, {arm} / genai, from paired blocks (95% intervals; the verdict reads "
        "the span of the batch means' and the runs'):",
        "",
        "| band | pairs | block pairs as independent | batches | batch means | runs | "
        "one mean per run | verdict's span | lag-1 autocorrelation |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for band, ratio in band_ratios(case, arm).items():
        lag = "–" if ratio.lag1 is None else f"{ratio.lag1:.2f}"
        lines.append(
            f"| {band.replace('-', '–')} | {ratio.pairs} | {_cell(ratio.blocks)} | "
            f"{ratio.batch_count} | {_cell(ratio.batches)} | {ratio.run_count} | "
            f"{_cell(ratio.runs)} | {_cell(ratio.verdict_interval)} | {lag} |"
        )
    return [*lines, ""]
