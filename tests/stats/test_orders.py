"""Tests for ovspec.stats.orders: AB/BA alternation and Williams-square balance."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovspec.errors import BadRequestError
from ovspec.stats.orders import Arm, ab_orders, williams_design, williams_orders, williams_square

PROPS = settings(max_examples=50, deadline=None)
seeds = st.integers(min_value=0, max_value=2**63 - 1)


def adjacent_pairs(rows: list[tuple[int, ...]] | list[tuple[str, ...]]) -> Counter[object]:
    return Counter((row[j], row[j + 1]) for row in rows for j in range(len(row) - 1))


def assert_each_condition_once_per_row_and_column(rows: list[tuple[int, ...]], k: int) -> None:
    for row in rows:
        assert sorted(row) == list(range(k))
    for col in range(k):
        column = [row[col] for row in rows]
        per_condition = Counter(column)
        assert set(per_condition) == set(range(k))
        assert len(set(per_condition.values())) == 1  # every condition equally often


# ---------------------------------------------------------------- Williams squares


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_williams_square_is_latin_and_balances_adjacent_pairs(k: int) -> None:
    square = williams_square(k)
    assert len(square) == k
    assert_each_condition_once_per_row_and_column(square, k)
    pairs = adjacent_pairs(square)
    expected = {(x, y) for x in range(k) for y in range(k) if x != y}
    assert set(pairs) == expected
    assert set(pairs.values()) == {1}


def test_williams_square_for_four_conditions() -> None:
    assert williams_square(4) == [(0, 3, 1, 2), (1, 0, 2, 3), (2, 1, 3, 0), (3, 2, 0, 1)]


def test_williams_square_for_two_conditions_is_ab_ba() -> None:
    assert williams_square(2) == [(0, 1), (1, 0)]


@pytest.mark.parametrize("k", [3, 5, 7])
def test_odd_k_has_no_square_but_a_two_k_row_design(k: int) -> None:
    with pytest.raises(BadRequestError, match="odd"):
        williams_square(k)
    rows = williams_design(k)
    assert len(rows) == 2 * k
    assert_each_condition_once_per_row_and_column(rows, k)
    pairs = adjacent_pairs(rows)
    assert set(pairs) == {(x, y) for x in range(k) for y in range(k) if x != y}
    assert set(pairs.values()) == {2}


@pytest.mark.parametrize("k", [0, 1, -2])
def test_too_few_conditions_are_a_bad_request(k: int) -> None:
    with pytest.raises(BadRequestError):
        williams_square(k)
    with pytest.raises(BadRequestError):
        williams_design(k)


# ---------------------------------------------------------------- Williams orders


@PROPS
@given(st.integers(min_value=2, max_value=7), st.integers(min_value=1, max_value=3), seeds)
def test_williams_orders_full_cycles_are_balanced(k: int, cycles: int, seed: int) -> None:
    conditions = [f"c{i}" for i in range(k)]
    rows = len(williams_design(k))
    orders = williams_orders(conditions, cycles * rows, seed)
    assert len(orders) == cycles * rows
    for order in orders:
        assert sorted(order) == sorted(conditions)
    for pos in range(k):
        assert set(Counter(order[pos] for order in orders).values()) == {cycles * rows // k}
    pairs = adjacent_pairs(orders)
    assert len(pairs) == k * (k - 1)
    assert set(pairs.values()) == {cycles * rows // k}


@PROPS
@given(st.integers(min_value=2, max_value=6), st.integers(min_value=1, max_value=20), seeds)
def test_williams_orders_are_deterministic_and_cycle(k: int, n_reps: int, seed: int) -> None:
    conditions = list("ABCDEF"[:k])
    orders = williams_orders(conditions, n_reps, seed)
    assert orders == williams_orders(conditions, n_reps, seed)
    rows = len(williams_design(k))
    for i in range(n_reps - rows):
        assert orders[i] == orders[i + rows]


def test_williams_orders_depend_on_the_seed() -> None:
    conditions = ["B0", "B1", "I1", "I2"]
    assert len({tuple(williams_orders(conditions, 4, seed)) for seed in range(20)}) > 1


def test_williams_orders_reject_bad_requests() -> None:
    with pytest.raises(BadRequestError, match="repeat"):
        williams_orders(["A", "A", "B"], 3, 0)
    with pytest.raises(BadRequestError, match="at least 2"):
        williams_orders(["A"], 3, 0)
    with pytest.raises(BadRequestError, match="n_reps"):
        williams_orders(["A", "B"], 0, 0)


# ---------------------------------------------------------------- AB/BA


@PROPS
@given(st.integers(min_value=1, max_value=40), seeds)
def test_ab_orders_alternate_and_are_balanced(n_pairs: int, seed: int) -> None:
    orders = ab_orders(n_pairs, seed)
    assert len(orders) == n_pairs
    for first, second in orders:
        assert second is first.other
    for earlier, later in itertools.pairwise(orders):
        assert later[0] is earlier[0].other
    leads = Counter(first for first, _ in orders)
    assert abs(leads[Arm.A] - leads[Arm.B]) == n_pairs % 2


@PROPS
@given(st.integers(min_value=1, max_value=40), seeds)
def test_ab_orders_are_deterministic_per_seed(n_pairs: int, seed: int) -> None:
    assert ab_orders(n_pairs, seed) == ab_orders(n_pairs, seed)


def test_ab_orders_start_with_either_arm_across_seeds() -> None:
    starts = {ab_orders(2, seed)[0][0] for seed in range(32)}
    assert starts == {Arm.A, Arm.B}


@pytest.mark.parametrize("n_pairs", [0, -1, True])
def test_ab_orders_reject_a_bad_count(n_pairs: int) -> None:
    with pytest.raises(BadRequestError, match="n_pairs"):
        ab_orders(n_pairs, 0)


def test_arm_other() -> None:
    assert Arm.A.other is Arm.B
    assert Arm.B.other is Arm.A
