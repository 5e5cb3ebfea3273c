"""The figures of lockstep runs, from the saved token times and run windows: each block's
ms per token, blocks paired with the other arm's block of the same round, and the ratio
with three 95% intervals (block pairs as if independent, batch means of consecutive
pairs, and one mean per run), since blocks of one run are serially correlated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from ovspec.bench.common.verdicts import CONFIDENCE, Interval

MIN_BLOCK_TOKENS = 3  # a block's rate needs two steps after the first token it shows


def block_rates(
    token_s: Sequence[float], windows_s: Sequence[Sequence[float]]
) -> list[tuple[float, float] | None]:
    """Per run window (resume, stop): (its middle token's index, ms per token). The rate
    runs from the first token stamped after the resume to the last before the stop: the
    step in flight when the arm was stopped (and cache warmth lost to the other arm) is
    left out, for every arm alike. None for a window with too few tokens."""
    out: list[tuple[float, float] | None] = []
    times = np.asarray(token_s, dtype=np.float64)
    for resume, stop in windows_s:
        inside = np.nonzero((times > resume) & (times <= stop))[0]
        if inside.size < MIN_BLOCK_TOKENS:
            out.append(None)
            continue
        first, last = int(inside[0]), int(inside[-1])
        ms = 1000.0 * (times[last] - times[first]) / (last - first)
        out.append(((first + last) / 2, ms))
    return out


def paired_blocks(
    reference: Sequence[tuple[float, float] | None], other: Sequence[tuple[float, float] | None]
) -> list[tuple[float, float, float]]:
    """Block j of each arm (the same round, adjacent in time, about the same tokens):
    (middle token index, reference ms, other ms), in order; unmatched blocks dropped."""
    out = []
    for a, b in zip(reference, other, strict=False):
        if a is not None and b is not None:
            out.append(((a[0] + b[0]) / 2, a[1], b[1]))
    return out


def in_band(
    pairs: Sequence[tuple[float, float, float]], prompt_tokens: int, band: Sequence[int]
) -> list[tuple[float, float]]:
    """The (reference, other) ms of pairs whose middle token's live context is in
    ``band`` (token i is made with ``prompt + i - 1`` tokens in the KV)."""
    lo, hi = band
    return [(a, b) for mid, a, b in pairs if lo <= prompt_tokens + mid - 1 < hi]


def _t_interval(logs: Sequence[float]) -> Interval | None:
    if len(logs) < 2:
        return None
    spread = statistics.stdev(logs)
    mean = statistics.fmean(logs)
    half = float(sps.t.ppf(0.5 + CONFIDENCE / 2, len(logs) - 1)) * spread / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def lag1_autocorrelation(runs: Sequence[Sequence[float]]) -> float | None:
    """Lag-1 autocorrelation of series measured in separate runs: each run centred on
    its own mean, neighbours taken within a run only (None under 3 values in all, or
    with no spread)."""
    products = squares = 0.0
    count = 0
    for values in runs:
        x = np.asarray(values, dtype=np.float64)
        count += x.size
        if x.size < 2:
            continue
        x = x - x.mean()
        products += float(np.dot(x[:-1], x[1:]))
        squares += float(np.dot(x, x))
    return products / squares if count >= 3 and squares > 0 else None


@dataclass(frozen=True)
class LockstepRatio:
    """Other over reference: the geometric mean of the block ratios and its intervals."""

    blocks: Interval | None  # every block pair as independent: too narrow if correlated
    batches: Interval | None  # means of ``batch_pairs`` consecutive pairs within a run
    runs: Interval | None  # one mean per run (independent processes)
    pairs: int
    batch_count: int
    run_count: int
    lag1: float | None  # of the block pairs' log ratios, pooled within runs

    @property
    def verdict_interval(self) -> Interval | None:
        """The interval a verdict reads: from the batch means' low end and the runs' to
        the higher of their high ends, around the mean of every pair. Batch means allow
        for the correlation of neighbouring blocks; the runs' interval for what differs
        between a run's processes as a whole (their memory layout, say), which batches
        of one run share. With one run, the batch means alone."""
        found = [i for i in (self.batches, self.runs) if i is not None]
        if self.blocks is None or not found:
            return None
        low, high = min(i.low for i in found), max(i.high for i in found)
        return Interval(
            self.blocks.estimate, min(low, self.blocks.estimate), max(high, self.blocks.estimate)
        )


def lockstep_ratio(
    pairs_by_run: Sequence[Sequence[tuple[float, float]]], batch_pairs: int
) -> LockstepRatio:
    """The ratio of paired blocks, each run's pairs in time order. A run's last
    incomplete batch joins its previous one (none is dropped)."""
    logs_by_run = [[math.log(b / a) for a, b in run if a > 0 and b > 0] for run in pairs_by_run]
    every = [x for run in logs_by_run for x in run]
    batches: list[float] = []
    for logs in logs_by_run:
        count = max(1, len(logs) // batch_pairs) if logs else 0
        for i in range(count):
            end = len(logs) if i == count - 1 else (i + 1) * batch_pairs
            batches.append(statistics.fmean(logs[i * batch_pairs : end]))
    per_run = [statistics.fmean(logs) for logs in logs_by_run if logs]
    return LockstepRatio(
        blocks=_t_interval(every),
        batches=_t_interval(batches),
        runs=_t_interval(per_run),
        pairs=len(every),
        batch_count=len(batches),
        run_count=len(per_run),
        lag1=lag1_autocorrelation(logs_by_run),
    )
