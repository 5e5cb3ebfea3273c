"""Paired statistics for A/B trials: one pair is the same work under arm A and arm B.

Owns the summary of paired differences (B − A): means, the paired-t interval, wins,
and the exact two-sided sign-flip permutation p-value with the smallest p the number
of pairs can give. numpy and scipy only; no OpenVINO. Returns values, never prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from ovspec.errors import BadRequestError, TrialError

# Bump when a key of ``PairedSummary.to_dict`` changes meaning.
# History: 1 — first format (2026-11).
STATS_FORMAT_VERSION = 1

DEFAULT_CONFIDENCE = 0.95

# Up to this many pairs the sign-flip p is exact. Meet-in-the-middle enumeration
# (two halves of 2^(n/2) signed sums, one sorted, the other binary-searched into it)
# costs O(2^(n/2) log) time and 2^(n/2) memory: ~0.2 s and ~40 MB at n = 40. Above
# that a seeded Monte-Carlo estimate is used and flagged as such.
EXACT_MAX_PAIRS = 40

DEFAULT_MONTE_CARLO_DRAWS = 100_000

# ``pairs_to_resolve`` stops looking past this many pairs (and answers None).
MOST_PAIRS = 100_000

# Sign patterns whose |sum| equals the observed |sum| in exact arithmetic can come
# out a few ulps apart once summed in another order; without this tolerance such
# ties would be dropped at random and the exact p would wobble by 1/2^n. Relative to
# sum(|d|), so scaling the data leaves p unchanged.
SIGN_FLIP_TIE_RTOL = 1e-9

# Differences whose spread is below this fraction of their magnitude are treated as
# identical: their t statistic is a float-noise artefact, not evidence.
IDENTICAL_DIFF_RTOL = 1e-12

# Monte-Carlo draws are generated in blocks of at most this many signs (int8).
_MC_BLOCK_SIGNS = 1 << 22


class SignFlipMethod(Enum):
    """How the sign-flip p-value was obtained."""

    EXACT = "exact"
    MONTE_CARLO = "monte_carlo"


def _check_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise TrialError(f"{name} is {value!r}, not a finite number")


def _check_probability(name: str, value: float) -> None:
    _check_finite(name, value)
    if not 0.0 <= value <= 1.0:
        raise TrialError(f"{name} {value!r} is not a probability in [0, 1]")


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, float | int) and 0.0 < confidence < 1.0):
        raise BadRequestError(
            f"confidence level {confidence!r} is not strictly between 0 and 1; use e.g. 0.95"
        )


@dataclass(frozen=True)
class PairedTTest:
    """Paired t on the differences B − A: statistic, two-sided p and the mean's CI."""

    confidence: float
    df: int
    t_statistic: float
    p_value: float
    ci_low: float
    ci_high: float

    def __post_init__(self) -> None:
        _check_confidence(self.confidence)
        if self.df < 1:
            raise TrialError(f"paired t with {self.df} degrees of freedom; need at least 2 pairs")
        _check_finite("t statistic", self.t_statistic)
        _check_probability("paired-t p", self.p_value)
        _check_finite("CI lower bound", self.ci_low)
        _check_finite("CI upper bound", self.ci_high)
        if self.ci_low > self.ci_high:
            raise TrialError(f"CI [{self.ci_low!r}, {self.ci_high!r}] has its bounds reversed")


@dataclass(frozen=True)
class SignFlipTest:
    """Two-sided sign-flip permutation test of the mean difference against zero.

    ``samples`` is the number of sign patterns evaluated: all 2^n when ``method`` is
    exact, else the number of seeded Monte-Carlo draws (``seed`` says which).
    ``min_attainable_p`` is the smallest p these pairs can give: 2 / 2^n, or
    2 / 2^(n − z) when z differences are exactly zero (their signs flip nothing).
    """

    method: SignFlipMethod
    n_pairs: int
    p_value: float
    min_attainable_p: float
    samples: int
    seed: int | None

    def __post_init__(self) -> None:
        if self.n_pairs < 2:
            raise TrialError(f"sign-flip test on {self.n_pairs} pairs; need at least 2")
        _check_probability("sign-flip p", self.p_value)
        _check_probability("minimum attainable p", self.min_attainable_p)
        floor = math.ldexp(1.0, 1 - self.n_pairs)
        if self.min_attainable_p < floor:
            raise TrialError(
                f"minimum attainable p {self.min_attainable_p!r} is below 2/2^{self.n_pairs}"
            )
        if self.method is SignFlipMethod.EXACT:
            if self.samples != 1 << self.n_pairs or self.seed is not None:
                raise TrialError(
                    f"an exact sign-flip test on {self.n_pairs} pairs enumerates "
                    f"2^{self.n_pairs} patterns with no seed, not {self.samples} (seed {self.seed})"
                )
            if self.p_value < self.min_attainable_p * (1.0 - 1e-12):
                raise TrialError(
                    f"exact sign-flip p {self.p_value!r} is below its floor "
                    f"{self.min_attainable_p!r}"
                )
        else:
            if self.samples < 1 or self.seed is None:
                raise TrialError(
                    "a Monte-Carlo sign-flip estimate needs at least one draw and a seed"
                )

    @property
    def is_exact(self) -> bool:
        return self.method is SignFlipMethod.EXACT


@dataclass(frozen=True)
class PairedSummary:
    """Summary of n paired measurements; every difference is B − A in ``unit``.

    Lower is taken as better (durations): ``b_faster_pairs`` counts pairs with B < A.
    ``relative_change`` is mean(B − A) / mean(A), so −0.225 means B took 22.5% less.
    """

    n_pairs: int
    unit: str
    mean_a: float
    mean_b: float
    mean_diff: float
    median_diff: float
    relative_change: float
    b_faster_pairs: int
    a_faster_pairs: int
    tied_pairs: int
    t_test: PairedTTest
    sign_flip: SignFlipTest

    def __post_init__(self) -> None:
        if self.n_pairs < 2:
            raise TrialError(f"{self.n_pairs} pairs cannot be summarized; run at least 2")
        if not self.unit.strip():
            raise TrialError("the unit of a paired summary is empty; give e.g. 's'")
        for name in ("mean_a", "mean_b", "mean_diff", "median_diff", "relative_change"):
            _check_finite(name, getattr(self, name))
        counts = (self.b_faster_pairs, self.a_faster_pairs, self.tied_pairs)
        if min(counts) < 0 or sum(counts) != self.n_pairs:
            raise TrialError(
                f"win counts B {self.b_faster_pairs} / A {self.a_faster_pairs} / "
                f"tied {self.tied_pairs} do not add up to {self.n_pairs} pairs"
            )
        scale = max(abs(self.mean_a), abs(self.mean_b), abs(self.mean_diff))
        if not math.isclose(self.mean_b - self.mean_a, self.mean_diff, abs_tol=1e-9 * scale):
            raise TrialError(
                f"mean difference {self.mean_diff!r} is not mean B {self.mean_b!r} "
                f"minus mean A {self.mean_a!r}"
            )
        if self.t_test.df != self.n_pairs - 1 or self.sign_flip.n_pairs != self.n_pairs:
            raise TrialError(f"the tests in this summary were not run on its {self.n_pairs} pairs")
        slack = 1e-9 * max(scale, abs(self.t_test.ci_low), abs(self.t_test.ci_high))
        if not self.t_test.ci_low - slack <= self.mean_diff <= self.t_test.ci_high + slack:
            raise TrialError(
                f"mean difference {self.mean_diff!r} lies outside its CI "
                f"[{self.t_test.ci_low!r}, {self.t_test.ci_high!r}]"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``format`` is ``STATS_FORMAT_VERSION``."""
        t, s = self.t_test, self.sign_flip
        return {
            "format": STATS_FORMAT_VERSION,
            "n_pairs": self.n_pairs,
            "unit": self.unit,
            "mean_a": self.mean_a,
            "mean_b": self.mean_b,
            "mean_diff": self.mean_diff,
            "median_diff": self.median_diff,
            "relative_change": self.relative_change,
            "b_faster_pairs": self.b_faster_pairs,
            "a_faster_pairs": self.a_faster_pairs,
            "tied_pairs": self.tied_pairs,
            "t_test": {
                "confidence": t.confidence,
                "df": t.df,
                "t_statistic": t.t_statistic,
                "p_value": t.p_value,
                "ci_low": t.ci_low,
                "ci_high": t.ci_high,
            },
            "sign_flip": {
                "method": s.method.value,
                "p_value": s.p_value,
                "min_attainable_p": s.min_attainable_p,
                "samples": s.samples,
                "seed": s.seed,
            },
        }


def _as_vector(name: str, values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TrialError(f"arm {name} values are not numbers: {exc}") from exc
    if arr.ndim != 1:
        raise TrialError(f"arm {name} values have shape {arr.shape}; expected a flat list")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise TrialError(
            f"arm {name} value {arr[bad[0]]!r} at pair {int(bad[0])} is not finite; "
            "drop or re-run that pair"
        )
    return arr


def _paired_arms(
    a: npt.ArrayLike, b: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    va, vb = _as_vector("A", a), _as_vector("B", b)
    if va.size != vb.size:
        raise TrialError(
            f"arm A has {va.size} values and arm B {vb.size}; a paired trial needs one of "
            "each per pair"
        )
    return va, vb


def paired_differences(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """B − A per pair, after checking both arms are flat, finite and the same length."""
    va, vb = _paired_arms(a, b)
    return vb - va


def _signed_sums(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """All 2^m sums ±v1 ± … ± vm (the empty sum is 0)."""
    sums = np.zeros(1, dtype=np.float64)
    for v in values:
        sums = np.concatenate((sums + v, sums - v))
    return sums


def _exact_extreme_count(diffs: npt.NDArray[np.float64], threshold: float) -> int:
    """Number of the 2^n sign patterns with |signed sum| >= threshold (threshold > 0)."""
    half = diffs.size // 2
    low = np.sort(_signed_sums(diffs[:half]))
    # Sorted queries make the binary searches walk memory in order (~2x faster).
    high = np.sort(_signed_sums(diffs[half:]))
    # A pattern is (h, l); |h + l| >= t splits into l >= t − h or l <= −t − h,
    # disjoint because t > 0.
    upper = low.size - np.searchsorted(low, threshold - high, side="left")
    lower = np.searchsorted(low, -threshold - high, side="right")
    return int(upper.sum()) + int(lower.sum())


def _monte_carlo_extreme_count(
    diffs: npt.NDArray[np.float64], threshold: float, draws: int, seed: int
) -> int:
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, _MC_BLOCK_SIGNS // diffs.size)
    count, done = 0, 0
    while done < draws:
        rows = min(rows_per_block, draws - done)
        signs = 1 - 2 * rng.integers(0, 2, size=(rows, diffs.size), dtype=np.int8)
        count += int(np.count_nonzero(np.abs(signs @ diffs) >= threshold))
        done += rows
    return count


def sign_flip_test(
    differences: npt.ArrayLike,
    *,
    seed: int = 0,
    exact_max_pairs: int = EXACT_MAX_PAIRS,
    monte_carlo_draws: int = DEFAULT_MONTE_CARLO_DRAWS,
) -> SignFlipTest:
    """Two-sided sign-flip permutation p of the paired differences; statistic |mean|.

    p is the fraction of the 2^n sign patterns whose |mean| is at least the observed
    one (ties within ``SIGN_FLIP_TIE_RTOL``). Exact up to ``exact_max_pairs`` pairs;
    above that a Monte-Carlo estimate from ``monte_carlo_draws`` draws seeded with
    ``seed``, as (hits + 1) / (draws + 1) so that an estimate is never 0.
    """
    if not 1 <= exact_max_pairs <= EXACT_MAX_PAIRS:
        raise BadRequestError(
            f"exact_max_pairs {exact_max_pairs} is outside 1..{EXACT_MAX_PAIRS}; exact "
            "enumeration above that needs too much memory"
        )
    if monte_carlo_draws < 1:
        raise BadRequestError(f"monte_carlo_draws {monte_carlo_draws} must be at least 1")
    diffs = _as_vector("B − A", differences)
    n = int(diffs.size)
    if n < 2:
        raise TrialError(f"{n} paired difference(s) cannot be tested; run at least 2 pairs")
    observed = abs(math.fsum(diffs.tolist()))
    threshold = observed - SIGN_FLIP_TIE_RTOL * math.fsum(np.abs(diffs).tolist())
    zeros = int(np.count_nonzero(diffs == 0.0))
    min_p = math.ldexp(1.0, 1 - (n - zeros)) if zeros < n else 1.0
    if n <= exact_max_pairs:
        hits = (1 << n) if threshold <= 0.0 else _exact_extreme_count(diffs, threshold)
        return SignFlipTest(
            method=SignFlipMethod.EXACT,
            n_pairs=n,
            p_value=hits / (1 << n),
            min_attainable_p=min_p,
            samples=1 << n,
            seed=None,
        )
    if threshold <= 0.0:
        hits = monte_carlo_draws
    else:
        hits = _monte_carlo_extreme_count(diffs, threshold, monte_carlo_draws, seed)
    # The observed pattern counts as one of the draws (Phipson & Smyth 2010): a
    # Monte-Carlo p of exactly 0 would claim more than any finite sample can show.
    return SignFlipTest(
        method=SignFlipMethod.MONTE_CARLO,
        n_pairs=n,
        p_value=(hits + 1) / (monte_carlo_draws + 1),
        min_attainable_p=min_p,
        samples=monte_carlo_draws,
        seed=seed,
    )


def _paired_t(diffs: npt.NDArray[np.float64], confidence: float) -> PairedTTest:
    n = int(diffs.size)
    df = n - 1
    mean = float(np.mean(diffs))
    se = float(np.std(diffs, ddof=1)) / math.sqrt(n)
    t_stat = mean / se
    half_width = float(sps.t.ppf(0.5 + confidence / 2.0, df)) * se
    return PairedTTest(
        confidence=float(confidence),
        df=df,
        t_statistic=t_stat,
        p_value=min(1.0, float(2.0 * sps.t.sf(abs(t_stat), df))),
        ci_low=mean - half_width,
        ci_high=mean + half_width,
    )


def pairs_to_resolve(
    summary: PairedSummary, half_width: float, *, most_pairs: int = MOST_PAIRS
) -> int | None:
    """How many pairs would give the mean difference a CI no wider than ``half_width``
    either side, at the summary's confidence and its pairs' standard deviation (the
    smallest such n; None past ``most_pairs``). Planning arithmetic: it assumes the SD
    measured from n pairs is the true one. A floor, not a power calculation: at a true
    difference of 0, an interval this wide ends below ``half_width`` about half the time."""
    if not (math.isfinite(half_width) and half_width > 0):
        raise BadRequestError(f"half-width {half_width!r} is not a positive number")
    if most_pairs < 2:
        raise BadRequestError(f"most_pairs {most_pairs} is below 2: no interval has fewer")
    t = summary.t_test
    quantile = 0.5 + t.confidence / 2.0
    sd = (t.ci_high - t.ci_low) / 2.0 / float(sps.t.ppf(quantile, t.df)) * math.sqrt(t.df + 1)

    def half(n: int) -> float:
        return float(sps.t.ppf(quantile, n - 1)) * sd / math.sqrt(n)

    if half(most_pairs) > half_width:
        return None
    low, high = 2, most_pairs  # half(n) falls with n: bisect for the first n that fits
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if half(mid) <= half_width else (mid + 1, high)
    return low


def summarize_pairs(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    unit: str = "s",
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    exact_max_pairs: int = EXACT_MAX_PAIRS,
    monte_carlo_draws: int = DEFAULT_MONTE_CARLO_DRAWS,
) -> PairedSummary:
    """Summarize paired measurements ``a[i]``, ``b[i]`` (same work, arms A and B).

    Raises ``TrialError`` rather than return a number that means nothing: fewer than
    2 pairs, lengths that differ, a non-finite value, identical differences (the t
    interval is undefined) or a zero mean of A (no relative change).
    """
    _check_confidence(confidence)
    va, vb = _paired_arms(a, b)
    diffs = vb - va
    n = int(diffs.size)
    if n < 2:
        raise TrialError(f"{n} pair(s) cannot give a confidence interval; run at least 2 pairs")
    magnitude = float(np.max(np.abs(diffs)))
    if float(np.ptp(diffs)) <= IDENTICAL_DIFF_RTOL * magnitude:
        raise TrialError(
            f"all {n} paired differences are identical ({float(diffs[0]):.6g} {unit}): the "
            "CI is undefined; check that the arms really differ and that the timer "
            "resolves run-to-run noise"
        )
    mean_a, mean_b = float(np.mean(va)), float(np.mean(vb))
    if mean_a == 0.0:
        raise TrialError(f"the mean of arm A is 0 {unit}: the change relative to A is undefined")
    mean_diff = float(np.mean(diffs))
    return PairedSummary(
        n_pairs=n,
        unit=unit,
        mean_a=mean_a,
        mean_b=mean_b,
        mean_diff=mean_diff,
        median_diff=float(np.median(diffs)),
        relative_change=mean_diff / mean_a,
        b_faster_pairs=int(np.count_nonzero(diffs < 0.0)),
        a_faster_pairs=int(np.count_nonzero(diffs > 0.0)),
        tied_pairs=int(np.count_nonzero(diffs == 0.0)),
        t_test=_paired_t(diffs, confidence),
        sign_flip=sign_flip_test(
            diffs,
            seed=seed,
            exact_max_pairs=exact_max_pairs,
            monte_carlo_draws=monte_carlo_draws,
        ),
    )


def format_summary(summary: PairedSummary, *, label_a: str = "A", label_b: str = "B") -> list[str]:
    """A few human lines for ``summary``; the caller prints or logs them."""
    s, t, f = summary, summary.t_test, summary.sign_flip
    u, a, b = s.unit, label_a, label_b
    level = f"{t.confidence * 100:g}%"
    lines = [
        f"{s.n_pairs} pairs: mean {a} {s.mean_a:.4g} {u}, mean {b} {s.mean_b:.4g} {u}",
        f"{b} − {a}: mean {s.mean_diff:+.4g} {u} ({s.relative_change:+.1%} of {a}), "
        f"median {s.median_diff:+.4g} {u}",
        f"{level} CI of the mean difference (paired t, df {t.df}): "
        f"[{t.ci_low:+.4g}, {t.ci_high:+.4g}] {u}; t = {t.t_statistic:.3f}, "
        f"two-sided p = {t.p_value:.3g}",
        f"{b} faster in {s.b_faster_pairs}/{s.n_pairs} pairs "
        f"({a} faster in {s.a_faster_pairs}, tied {s.tied_pairs})",
    ]
    if f.is_exact:
        line = (
            f"exact sign-flip p = {f.p_value:.4g} (all 2^{f.n_pairs} sign patterns); "
            f"the smallest p these {f.n_pairs} pairs can give is {f.min_attainable_p:.4g}"
        )
        alpha = 1.0 - t.confidence
        if f.min_attainable_p > alpha:
            line += f", so they cannot reach p < {alpha:.3g}"
    else:
        line = (
            f"Monte-Carlo sign-flip p ≈ {f.p_value:.4g} ({f.samples} draws, seed {f.seed}; "
            f"{f.n_pairs} pairs are too many to enumerate all 2^{f.n_pairs} patterns)"
        )
    lines.append(line)
    return lines
