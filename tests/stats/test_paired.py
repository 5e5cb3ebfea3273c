"""Tests for ovspec.stats.paired: agreement with scipy, the exact sign-flip p, the A/B laws."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from ovspec.errors import BadRequestError, TrialError
from ovspec.stats.paired import (
    EXACT_MAX_PAIRS,
    SIGN_FLIP_TIE_RTOL,
    PairedSummary,
    SignFlipMethod,
    format_summary,
    pairs_to_resolve,
    sign_flip_test,
    summarize_pairs,
)

PROPS = settings(max_examples=60, deadline=None)

value = st.floats(min_value=0.5, max_value=100.0, allow_nan=False, allow_infinity=False)


@st.composite
def arms(draw: st.DrawFn, min_n: int = 2, max_n: int = 12) -> tuple[list[float], list[float]]:
    """Two equal-length lists of positive durations whose differences are not all equal."""
    n = draw(st.integers(min_value=min_n, max_value=max_n))
    a = draw(st.lists(value, min_size=n, max_size=n))
    b = draw(st.lists(value, min_size=n, max_size=n))
    d = np.asarray(b) - np.asarray(a)
    # Near-identical differences make t explode and are rejected on purpose (tested
    # below); keep the cross-checks to data where the t interval means something.
    assume(float(np.ptp(d)) > 1e-6 * float(np.max(np.abs(d))))
    return a, b


def brute_force_sign_flip_p(diffs: list[float]) -> float:
    """All 2^n sign patterns written out one by one; statistic |mean|, same tie rule."""
    n = len(diffs)
    observed = abs(math.fsum(diffs) / n)
    slack = SIGN_FLIP_TIE_RTOL * math.fsum(abs(x) for x in diffs) / n
    extreme = 0
    for signs in itertools.product((1.0, -1.0), repeat=n):
        mean = math.fsum(s * x for s, x in zip(signs, diffs, strict=True)) / n
        if abs(mean) >= observed - slack:
            extreme += 1
    return math.ldexp(extreme, -n)


def vectorised_sign_flip_p(diffs: npt.NDArray[np.float64]) -> float:
    """All 2^n patterns as one bit matrix: a second, independent enumeration."""
    n = int(diffs.size)
    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    sums = (1 - 2 * bits) @ diffs
    slack = SIGN_FLIP_TIE_RTOL * float(np.abs(diffs).sum())
    hits = int(np.count_nonzero(np.abs(sums) >= abs(float(diffs.sum())) - slack))
    return math.ldexp(hits, -n)


# ---------------------------------------------------------------- agreement with scipy


@PROPS
@given(arms(), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_mean_ci_t_and_p_agree_with_scipy_ttest_rel(
    data: tuple[list[float], list[float]], confidence: float
) -> None:
    a, b = data
    s = summarize_pairs(a, b, confidence=confidence)
    ref = sps.ttest_rel(b, a)  # scipy's differences are first − second: B − A here
    ci = ref.confidence_interval(confidence_level=confidence)
    d = np.asarray(b) - np.asarray(a)
    assert s.n_pairs == len(a)
    assert s.mean_diff == pytest.approx(float(np.mean(d)), rel=1e-12, abs=1e-12)
    assert s.median_diff == pytest.approx(float(np.median(d)), rel=1e-12, abs=1e-12)
    assert s.mean_a == pytest.approx(float(np.mean(a)))
    assert s.mean_b == pytest.approx(float(np.mean(b)))
    assert s.relative_change == pytest.approx(s.mean_diff / s.mean_a)
    assert s.t_test.df == len(a) - 1
    assert s.t_test.t_statistic == pytest.approx(float(ref.statistic), rel=1e-7)
    assert s.t_test.p_value == pytest.approx(float(ref.pvalue), rel=1e-7, abs=1e-14)
    assert s.t_test.ci_low == pytest.approx(float(ci.low), rel=1e-7, abs=1e-9)
    assert s.t_test.ci_high == pytest.approx(float(ci.high), rel=1e-7, abs=1e-9)
    assert s.b_faster_pairs == int(np.sum(d < 0))
    assert s.a_faster_pairs == int(np.sum(d > 0))
    assert s.b_faster_pairs + s.a_faster_pairs + s.tied_pairs == s.n_pairs


# ---------------------------------------------------------------- the sign-flip p


@pytest.mark.parametrize(
    ("diffs", "expected"),
    [
        # n = 5, all the same sign: only the observed pattern and its mirror are as
        # extreme, p = 2/32, which is also the floor for 5 pairs.
        ([0.4, 0.1, 0.3, 0.2, 0.5], 0.0625),
        ([-1.0, -2.0, -3.0, -4.0, -5.0], 0.0625),
        # n = 3, d = (1, 2, 3): signed sums ±1 ±2 ±3 are 6, 0, 2, −4, 4, −2, 0, −6;
        # |sum| >= 6 for 2 of the 8 patterns, p = 0.25.
        ([1.0, 2.0, 3.0], 0.25),
        # n = 3, d = (3, −1, 1): observed sum 3; signed sums 3, 1, 5, 3, −3, −5, −1, −3;
        # |sum| >= 3 for 6 of 8, p = 0.75 (exact ties at 3 must all count).
        ([3.0, -1.0, 1.0], 0.75),
        # n = 4 with one zero difference: its sign changes nothing, so p doubles to
        # 4/16 = 0.25 and so does the floor.
        ([0.0, 1.0, 2.0, 3.0], 0.25),
        # Observed mean exactly 0: every pattern is as extreme, p = 1.
        ([1.0, -1.0], 1.0),
        # n = 2 floor: 2/4.
        ([1.0, 2.0], 0.5),
    ],
)
def test_sign_flip_hand_enumerated_cases(diffs: list[float], expected: float) -> None:
    result = sign_flip_test(diffs)
    assert result.method is SignFlipMethod.EXACT
    assert result.p_value == expected
    assert result.samples == 2 ** len(diffs)
    assert result.seed is None


def test_min_attainable_p_is_two_over_two_to_the_n() -> None:
    assert sign_flip_test([1.0, 2.0, 3.0, 4.0, 5.0]).min_attainable_p == 0.0625
    assert sign_flip_test([1.0, 2.0]).min_attainable_p == 0.5
    assert sign_flip_test(np.arange(1.0, 21.0)).min_attainable_p == 2.0 / 2**20
    # An exactly-zero difference cannot flip, so the floor is that of n − 1 pairs.
    assert sign_flip_test([0.0, 1.0, 2.0, 3.0, 4.0]).min_attainable_p == 0.125


@PROPS
@given(
    st.lists(st.floats(min_value=-100.0, max_value=100.0, allow_nan=False), min_size=2, max_size=10)
)
def test_sign_flip_matches_brute_force_on_floats(diffs: list[float]) -> None:
    assert sign_flip_test(diffs).p_value == brute_force_sign_flip_p(diffs)


@PROPS
@given(st.lists(st.integers(min_value=-4, max_value=4), min_size=2, max_size=10))
def test_sign_flip_matches_brute_force_on_tie_heavy_integers(ints: list[int]) -> None:
    diffs = [float(x) for x in ints]
    result = sign_flip_test(diffs)
    assert result.p_value == brute_force_sign_flip_p(diffs)
    assert result.p_value >= result.min_attainable_p


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=11, max_value=16), st.integers(min_value=0, max_value=2**32 - 1))
def test_sign_flip_matches_vectorised_enumeration_for_larger_n(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    diffs = rng.normal(loc=rng.uniform(-1.0, 1.0), scale=1.0, size=n)
    assert sign_flip_test(diffs).p_value == vectorised_sign_flip_p(diffs)


def test_sign_flip_exact_at_the_limit_and_monte_carlo_above() -> None:
    rng = np.random.default_rng(7)
    at_limit = sign_flip_test(rng.normal(0.3, 1.0, EXACT_MAX_PAIRS))
    assert at_limit.is_exact
    assert at_limit.samples == 2**EXACT_MAX_PAIRS
    above = sign_flip_test(rng.normal(0.3, 1.0, EXACT_MAX_PAIRS + 1), seed=3)
    assert above.method is SignFlipMethod.MONTE_CARLO
    assert not above.is_exact
    assert above.seed == 3


def test_monte_carlo_estimate_is_seeded_and_close_to_exact() -> None:
    rng = np.random.default_rng(11)
    diffs = rng.normal(0.4, 1.0, 14)
    exact = sign_flip_test(diffs).p_value
    draws = 40_000
    mc = sign_flip_test(diffs, exact_max_pairs=5, monte_carlo_draws=draws, seed=5)
    again = sign_flip_test(diffs, exact_max_pairs=5, monte_carlo_draws=draws, seed=5)
    assert mc.method is SignFlipMethod.MONTE_CARLO
    assert mc == again
    se = math.sqrt(exact * (1 - exact) / draws)
    assert abs(mc.p_value - exact) < 5 * se + 1 / draws


def test_monte_carlo_p_is_never_zero() -> None:
    diffs = np.full(60, 1.0) + np.linspace(0.0, 0.1, 60)  # every difference positive
    result = sign_flip_test(diffs, monte_carlo_draws=1000, seed=0)
    assert result.method is SignFlipMethod.MONTE_CARLO
    assert result.p_value == 1 / 1001


def test_sign_flip_rejects_bad_parameters() -> None:
    with pytest.raises(BadRequestError):
        sign_flip_test([1.0, 2.0], exact_max_pairs=EXACT_MAX_PAIRS + 1)
    with pytest.raises(BadRequestError):
        sign_flip_test([1.0, 2.0], exact_max_pairs=0)
    with pytest.raises(BadRequestError):
        sign_flip_test([1.0, 2.0], monte_carlo_draws=0)
    with pytest.raises(TrialError):
        sign_flip_test([1.0])


# ---------------------------------------------------------------- laws


@PROPS
@given(arms())
def test_swapping_arms_negates_the_effect_and_keeps_p(
    data: tuple[list[float], list[float]],
) -> None:
    a, b = data
    ab = summarize_pairs(a, b)
    ba = summarize_pairs(b, a)
    assert ba.mean_diff == pytest.approx(-ab.mean_diff, rel=1e-12, abs=1e-12)
    assert ba.median_diff == pytest.approx(-ab.median_diff, rel=1e-12, abs=1e-12)
    assert ba.t_test.ci_low == pytest.approx(-ab.t_test.ci_high, rel=1e-9, abs=1e-9)
    assert ba.t_test.ci_high == pytest.approx(-ab.t_test.ci_low, rel=1e-9, abs=1e-9)
    assert ba.t_test.t_statistic == pytest.approx(-ab.t_test.t_statistic, rel=1e-9)
    assert ba.t_test.p_value == pytest.approx(ab.t_test.p_value, rel=1e-9, abs=1e-15)
    assert ba.sign_flip.p_value == ab.sign_flip.p_value
    assert (ba.b_faster_pairs, ba.a_faster_pairs) == (ab.a_faster_pairs, ab.b_faster_pairs)
    assert ba.tied_pairs == ab.tied_pairs
    # B relative to A and A relative to B: opposite signs, (1 + r)(1 + r') = 1.
    if ab.mean_diff != 0.0:
        assert math.copysign(1.0, ba.relative_change) == -math.copysign(1.0, ab.relative_change)
    assert (1 + ab.relative_change) * (1 + ba.relative_change) == pytest.approx(1.0)


@PROPS
@given(arms(), st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_the_data_leaves_p_unchanged(
    data: tuple[list[float], list[float]], scale: float
) -> None:
    a, b = data
    plain = summarize_pairs(a, b)
    scaled = summarize_pairs([x * scale for x in a], [x * scale for x in b])
    assert scaled.sign_flip.p_value == plain.sign_flip.p_value
    assert scaled.t_test.p_value == pytest.approx(plain.t_test.p_value, rel=1e-6, abs=1e-12)
    assert scaled.relative_change == pytest.approx(plain.relative_change, rel=1e-9, abs=1e-12)
    assert scaled.mean_diff == pytest.approx(plain.mean_diff * scale, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- errors, never verdicts


@pytest.mark.parametrize(("a", "b"), [([], []), ([1.0], [2.0])])
def test_fewer_than_two_pairs_is_an_error(a: list[float], b: list[float]) -> None:
    with pytest.raises(TrialError, match="at least 2 pairs") as info:
        summarize_pairs(a, b)
    assert info.value.exit_code == 4


@pytest.mark.parametrize("offset", [0.0, 0.5, -0.25])
def test_identical_differences_are_an_error(offset: float) -> None:
    a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    b = [x + offset for x in a]
    with pytest.raises(TrialError, match="all 6 paired differences are identical"):
        summarize_pairs(a, b)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_an_error(bad: float) -> None:
    with pytest.raises(TrialError, match="not finite"):
        summarize_pairs([1.0, 2.0, bad], [1.5, 2.5, 3.0])
    with pytest.raises(TrialError, match="not finite"):
        summarize_pairs([1.0, 2.0, 3.0], [1.5, bad, 3.0])


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(TrialError, match="arm A has 3 values and arm B 2"):
        summarize_pairs([1.0, 2.0, 3.0], [1.0, 2.0])


def test_malformed_input_is_an_error() -> None:
    with pytest.raises(TrialError, match="flat list"):
        summarize_pairs([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 5.0]])
    with pytest.raises(TrialError, match="not numbers"):
        summarize_pairs(["fast", "slow"], [1.0, 2.0])


def test_zero_mean_of_a_is_an_error() -> None:
    with pytest.raises(TrialError, match="relative to A is undefined"):
        summarize_pairs([-1.0, 1.0], [2.0, 1.0])


@pytest.mark.parametrize("confidence", [0.0, 1.0, 95.0, -0.5])
def test_bad_confidence_is_a_bad_request(confidence: float) -> None:
    with pytest.raises(BadRequestError, match="confidence level"):
        summarize_pairs([1.0, 2.0, 3.0], [1.1, 2.3, 2.9], confidence=confidence)


# ---------------------------------------------------------------- the record


SEED_LIKE_A = [10.0, 11.0, 12.0, 13.0, 14.0]
SEED_LIKE_B = [9.0, 9.5, 11.0, 12.2, 13.0]


def test_summary_is_frozen_and_validates() -> None:
    s = summarize_pairs(SEED_LIKE_A, SEED_LIKE_B)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.mean_diff = 0.0  # type: ignore[misc]
    with pytest.raises(TrialError, match="do not add up"):
        dataclasses.replace(s, b_faster_pairs=4)
    with pytest.raises(TrialError, match="not mean B"):
        dataclasses.replace(s, mean_diff=s.mean_diff + 1.0)
    with pytest.raises(TrialError, match="not a finite number"):
        dataclasses.replace(s, mean_a=math.nan)
    with pytest.raises(TrialError, match="were not run on"):
        dataclasses.replace(s, n_pairs=6, tied_pairs=1)
    with pytest.raises(TrialError, match="below its floor"):
        dataclasses.replace(s.sign_flip, p_value=0.01)


def test_to_dict_is_json_and_complete() -> None:
    s = summarize_pairs(SEED_LIKE_A, SEED_LIKE_B)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["format"] == 1
    assert d["n_pairs"] == 5
    assert d["unit"] == "s"
    assert d["b_faster_pairs"] == 5
    assert d["sign_flip"] == {
        "method": "exact",
        "p_value": 0.0625,
        "min_attainable_p": 0.0625,
        "samples": 32,
        "seed": None,
    }
    assert d["t_test"]["confidence"] == 0.95
    assert d["t_test"]["ci_low"] < d["mean_diff"] < d["t_test"]["ci_high"]
    fields = {f.name for f in dataclasses.fields(PairedSummary)}
    assert fields <= set(d)


def test_format_summary_states_the_floor_for_five_pairs() -> None:
    s = summarize_pairs(SEED_LIKE_A, SEED_LIKE_B)
    lines = format_summary(s, label_a="I1", label_b="I2")
    assert all(isinstance(line, str) and "\n" not in line for line in lines)
    text = "\n".join(lines)
    assert "5 pairs" in text
    assert "I2 faster in 5/5 pairs" in text
    assert "95% CI" in text
    assert "exact sign-flip p = 0.0625" in text
    assert "smallest p these 5 pairs can give is 0.0625" in text
    assert "cannot reach p < 0.05" in text


def test_format_summary_flags_monte_carlo() -> None:
    rng = np.random.default_rng(2)
    a = rng.uniform(10.0, 12.0, 50)
    b = a - rng.normal(0.5, 0.3, 50)
    text = "\n".join(format_summary(summarize_pairs(a, b, seed=9, monte_carlo_draws=2000)))
    assert "Monte-Carlo sign-flip p ≈" in text
    assert "2000 draws, seed 9" in text
    assert "cannot reach" not in text


def test_pairs_to_resolve_finds_the_first_n_whose_interval_fits() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(10.0, 1.0, 6)
    b = a + rng.normal(0.0, 0.5, 6)
    summary = summarize_pairs(a, b)
    sd = float(np.std(b - a, ddof=1))
    for half_width in (0.5, 0.1, 0.02):
        n = pairs_to_resolve(summary, half_width)
        assert n is not None

        def half(k: int) -> float:
            return float(sps.t.ppf(0.975, k - 1)) * sd / math.sqrt(k)

        assert half(n) <= half_width < half(n - 1)
    # The interval the summary has is resolved by its own pair count, not fewer.
    own = (summary.t_test.ci_high - summary.t_test.ci_low) / 2
    assert pairs_to_resolve(summary, own * 1.000001) == 6
    assert pairs_to_resolve(summary, 1e-9, most_pairs=1000) is None
    with pytest.raises(BadRequestError):
        pairs_to_resolve(summary, 0.0)
    with pytest.raises(BadRequestError):
        pairs_to_resolve(summary, 0.5, most_pairs=1)
