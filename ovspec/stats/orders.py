"""Counterbalanced run orders for paired trials (Williams designs).

Owns which arm or condition runs first in each replication: AB/BA alternating from a
seeded start for two arms, and Williams squares for k conditions, so that order and
first-order carry-over effects are balanced rather than confounded with the arms.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from enum import Enum
from typing import TypeVar

from ovspec.errors import BadRequestError

T = TypeVar("T", bound=Hashable)


class Arm(Enum):
    """The two arms of an A/B trial."""

    A = "A"
    B = "B"

    @property
    def other(self) -> Arm:
        return Arm.B if self is Arm.A else Arm.A


def _check_count(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadRequestError(f"{name} {value!r} is not an integer >= {minimum}")


def ab_orders(n_pairs: int, seed: int) -> list[tuple[Arm, Arm]]:
    """Orders for ``n_pairs`` A/B pairs: AB and BA alternating from a seeded start.

    Each order is run once per pair; with an even ``n_pairs`` each arm goes first in
    exactly half of them, with an odd one the counts differ by one.
    """
    _check_count("n_pairs", n_pairs, 1)
    first = Arm.A if random.Random(seed).random() < 0.5 else Arm.B
    orders: list[tuple[Arm, Arm]] = []
    for i in range(n_pairs):
        lead = first if i % 2 == 0 else first.other
        orders.append((lead, lead.other))
    return orders


def _williams_rows(k: int) -> list[tuple[int, ...]]:
    # Classic construction: first row 0, 1, k−1, 2, k−2, …; row i adds i mod k. For
    # even k the steps between neighbours hit every nonzero residue once, so each
    # ordered adjacent pair occurs once; for odd k the mirrored rows are needed too.
    first: list[int] = []
    low, high = 0, k - 1
    for j in range(k):
        if j % 2 == 0:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    rows = [tuple((c + i) % k for c in first) for i in range(k)]
    if k % 2 == 1:
        rows += [row[::-1] for row in rows]
    return rows


def williams_square(k: int) -> list[tuple[int, ...]]:
    """The k×k Williams Latin square on conditions 0..k−1, for even k >= 2.

    Each condition appears once per row and once per column, and each ordered pair of
    adjacent conditions (x then y, x != y) occurs in exactly one row.
    """
    _check_count("number of conditions", k, 2)
    if k % 2 == 1:
        raise BadRequestError(
            f"no single Williams square balances {k} conditions (odd); use williams_design "
            "for the 2k-row design"
        )
    return _williams_rows(k)


def williams_design(k: int) -> list[tuple[int, ...]]:
    """Rows of a Williams design on conditions 0..k−1: k rows for even k, 2k for odd.

    For odd k the square is followed by its mirror image, and each ordered adjacent
    pair then occurs in exactly two rows.
    """
    _check_count("number of conditions", k, 2)
    return _williams_rows(k)


def williams_orders(conditions: Sequence[T], n_reps: int, seed: int) -> list[tuple[T, ...]]:
    """``n_reps`` run orders of ``conditions``, cycling the rows of a Williams design.

    The design's rows are put in a seeded random order and cycled; when ``n_reps`` is
    a multiple of the row count (k for even k, 2k for odd) the orders are fully
    balanced for position and first-order carry-over.
    """
    k = len(conditions)
    if k < 2:
        raise BadRequestError(f"{k} condition(s) need no counterbalancing; give at least 2")
    if len(set(conditions)) != k:
        raise BadRequestError(f"conditions {list(conditions)!r} repeat; name each once")
    _check_count("n_reps", n_reps, 1)
    rows = _williams_rows(k)
    random.Random(seed).shuffle(rows)
    return [tuple(conditions[c] for c in rows[i % len(rows)]) for i in range(n_reps)]
