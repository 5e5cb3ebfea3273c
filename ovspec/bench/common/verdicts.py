"""A page's verdicts, decided by an interval's bound and never by a point estimate: a
target is met when the whole 95% interval satisfies it, not met when the whole interval
misses it, and otherwise not established (with the interval given). Also the paired
ratio with its interval that most verdicts read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from scipy import stats as sps

from ovspec.errors import TrialError
from ovspec.stats.paired import DEFAULT_CONFIDENCE, IDENTICAL_DIFF_RTOL, summarize_pairs

CONFIDENCE = DEFAULT_CONFIDENCE


class Verdict(Enum):
    MET = "met"
    NOT_MET = "not met"
    NOT_ESTABLISHED = "not established"

    def bold(self) -> str:
        return f"**{self.value}**"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% interval (a ratio, a fraction or seconds)."""

    estimate: float
    low: float
    high: float

    def __post_init__(self) -> None:
        values = (self.estimate, self.low, self.high)
        if not all(math.isfinite(v) for v in values) or not self.low <= self.high:
            raise ValueError(f"inconsistent interval {self}")

    def text(self, digits: int = 2, suffix: str = "") -> str:
        return (
            f"{self.estimate:.{digits}f}{suffix} "
            f"[{self.low:.{digits}f}{suffix}, {self.high:.{digits}f}{suffix}]"
        )


def at_most(interval: Interval | None, target: float) -> Verdict:
    """Met when the interval's upper end is at or under ``target``."""
    if interval is None:
        return Verdict.NOT_ESTABLISHED
    if interval.high <= target:
        return Verdict.MET
    if interval.low > target:
        return Verdict.NOT_MET
    return Verdict.NOT_ESTABLISHED


def at_least(interval: Interval | None, target: float) -> Verdict:
    """Met when the interval's lower end is at or over ``target``."""
    if interval is None:
        return Verdict.NOT_ESTABLISHED
    if interval.low >= target:
        return Verdict.MET
    if interval.high < target:
        return Verdict.NOT_MET
    return Verdict.NOT_ESTABLISHED


def within(interval: Interval | None, center: float, tolerance: float) -> Verdict:
    """Met when the whole interval lies in ``center`` ± ``tolerance``; not met when it
    lies wholly outside that band."""
    if interval is None:
        return Verdict.NOT_ESTABLISHED
    lo, hi = center - tolerance, center + tolerance
    if lo <= interval.low and interval.high <= hi:
        return Verdict.MET
    if interval.low > hi or interval.high < lo:
        return Verdict.NOT_MET
    return Verdict.NOT_ESTABLISHED


def combined(verdicts: Sequence[Verdict]) -> Verdict:
    """Every part met: met; any part not met: not met; otherwise not established."""
    if verdicts and all(v is Verdict.MET for v in verdicts):
        return Verdict.MET
    if any(v is Verdict.NOT_MET for v in verdicts):
        return Verdict.NOT_MET
    return Verdict.NOT_ESTABLISHED


def paired_ratio(pairs: Sequence[tuple[float, float]]) -> Interval | None:
    """B over A for pairs ``(a, b)``: the geometric mean of the per-pair ratios with a
    paired-t 95% interval over their logs. None with fewer than 2 pairs or ratios that
    do not vary (no interval)."""
    if len(pairs) < 2 or any(a <= 0 or b <= 0 for a, b in pairs):
        return None
    logs = [math.log(b / a) for a, b in pairs]
    spread = statistics.stdev(logs)
    if spread <= IDENTICAL_DIFF_RTOL * max(abs(x) for x in logs) or spread == 0.0:
        return None
    mean = statistics.fmean(logs)
    half = float(sps.t.ppf(0.5 + CONFIDENCE / 2, len(logs) - 1)) * spread / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def paired_relative_change(pairs: Sequence[tuple[float, float]]) -> Interval | None:
    """(B − A) / mean(A) for pairs ``(a, b)``: the mean difference and its paired-t 95%
    interval, each divided by A's mean. None with fewer than 2 pairs."""
    if len(pairs) < 2:
        return None
    try:
        summary = summarize_pairs([a for a, _ in pairs], [b for _, b in pairs], unit="units")
    except TrialError:
        return None
    scale = summary.mean_a
    if scale <= 0:
        return None
    return Interval(
        summary.mean_diff / scale, summary.t_test.ci_low / scale, summary.t_test.ci_high / scale
    )
