"""The speed benchmark's figures from its runs' token times: a band's mean ms per
token, and an arm's ratios to genai paired by repetition. Pure (numpy and scipy through
``ovspec.stats``): the page recomputes them from the saved runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ovspec.bench.common.verdicts import paired_ratio as paired_ratio_interval


def band_ms(token_s: Sequence[float], prompt_tokens: int, band: tuple[int, int]) -> float | None:
    """Mean ms per decode step whose live context (KV tokens before it) is in ``band``.
    Step i (i >= 1) emits token i with ``prompt + i - 1`` tokens already in the KV."""
    lo, hi = band
    steps = [
        token_s[i] - token_s[i - 1]
        for i in range(1, len(token_s))
        if lo <= prompt_tokens + i - 1 < hi
    ]
    return 1000.0 * statistics.fmean(steps) if steps else None


def boundary_steps_ms(
    token_s: Sequence[float], prompt_tokens: int, rungs: Sequence[int]
) -> list[float]:
    """The ms of each decode step that crosses a rung boundary: the step starting from
    exactly a rung's capacity of live tokens (the top rung has no boundary, nor does a
    rung the prompt already passed). For genai, which has no rungs, the same steps."""
    out = []
    for capacity in sorted(rungs)[:-1]:
        i = capacity - prompt_tokens + 1  # step i starts from prompt + i - 1 live tokens
        if 1 <= i < len(token_s):
            out.append(1000.0 * (token_s[i] - token_s[i - 1]))
    return out


def paired_band_ratios(
    runs: Sequence[Mapping[str, Any]],
    arm: str,
    prompt_tokens: int,
    bands: Sequence[Sequence[int]],
) -> dict[str, dict[str, Any] | None]:
    """Per band, ``arm``'s ms per token over genai's paired by repetition (the runs of
    one repetition are adjacent in time, so the VM's drift between repetitions cancels):
    the geometric mean ratio with a paired-t 95% interval over the repetitions' log
    ratios, and the ratios themselves. None for a band with fewer than 2 pairs."""
    by_rep: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in runs:
        by_rep.setdefault(int(r.get("repetition", 0)), {})[r["arm"]] = r
    out: dict[str, dict[str, Any] | None] = {}
    for lo, hi in bands:
        pairs = []
        for rep in sorted(by_rep):
            mine, ref = by_rep[rep].get(arm), by_rep[rep].get("genai")
            if mine is None or ref is None:
                continue
            a = band_ms(ref["token_s"], prompt_tokens, (lo, hi))
            b = band_ms(mine["token_s"], prompt_tokens, (lo, hi))
            if a and b:
                pairs.append((a, b))
        out[f"{lo}-{hi}"] = _log_ratio_summary(pairs)
    return out


def paired_ratio(
    runs: Sequence[Mapping[str, Any]], arm: str, metric: Callable[[Mapping[str, Any]], float]
) -> dict[str, Any] | None:
    """``metric`` of ``arm``'s runs over genai's, paired by repetition: the geometric
    mean ratio with its paired-t 95% interval (None with fewer than 2 pairs)."""
    by_rep: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in runs:
        by_rep.setdefault(int(r.get("repetition", 0)), {})[r["arm"]] = r
    pairs = [
        (metric(reps["genai"]), metric(reps[arm]))
        for _, reps in sorted(by_rep.items())
        if "genai" in reps and arm in reps
    ]
    return _log_ratio_summary(pairs)


def _log_ratio_summary(pairs: Sequence[tuple[float, float]]) -> dict[str, Any] | None:
    interval = paired_ratio_interval(pairs)
    if interval is None:
        return None
    return {
        "ratio": interval.estimate,
        "ci": [interval.low, interval.high],
        "per_repetition": [b / a for a, b in pairs],
    }
