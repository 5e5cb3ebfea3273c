"""The write-up's metrics on a synthetic trace, and the campaign's Williams orders (N=5)."""

from __future__ import annotations

import itertools

import pytest

from ovspec.bench.protocols.metrics import RunFigures, compute, open_to_last_reserved
from ovspec.ladder import Ladder
from ovspec.runtime.decoding import DecodeResult
from ovspec.runtime.kvcache import Migration
from ovspec.runtime.loader import EventKind, LoaderEvent
from ovspec.runtime.session import BoundaryRecord, StepRecord
from ovspec.stats.orders import williams_orders


def _trace() -> DecodeResult:
    """Open at 0; the first rung (4 tokens, 100 bytes) is ready at 2 s; the prompt runs
    2-3 s; decode steps at 3, 4 (rung 4, 100 bytes) and 5, 6 (rung 8, 200 bytes) s; the
    last token at 7 s. One boundary at 4 live tokens, migration 10 ms; the successor
    was loaded at 4.5 s and the boundary came at 5 s."""
    steps = [StepRecord(0, 4, 2, True, 2.0, 1.0)]
    steps += [StepRecord(2 + i, 4 if i < 2 else 8, 1, False, 3.0 + i, 0.5) for i in range(4)]
    migration = Migration(4, 8, 4, 100, 200, 0.010, 300)
    events = [
        LoaderEvent(EventKind.LOAD_START, "decode@4", 0.0, True),
        LoaderEvent(EventKind.COMPILED, "decode@4", 1.5, True, 1.2, build_s=1.4),
        LoaderEvent(EventKind.LOADED, "decode@4", 2.0, True, 0.3),
        LoaderEvent(EventKind.LOAD_START, "decode@8", 3.0, False),
        LoaderEvent(EventKind.COMPILED, "decode@8", 4.2, False, 1.0, build_s=1.1),
        LoaderEvent(EventKind.LOADED, "decode@8", 4.5, False, 0.25),
    ]
    return DecodeResult(
        prompt_tokens=2,
        token_ids=(1, 2, 3, 4),
        rungs=(4, 8),
        steps=tuple(steps),
        boundaries=(BoundaryRecord(4, 5.0, migration, 0.0, 0.0),),
        events=tuple(events),
        ready_s=2.0,
        first_token_s=3.0,
        finished_s=7.0,
        reserved_kv=((2, 100), (2, 100), (3, 100), (4, 200), (5, 200)),
    )


def test_open_to_last_reserved_counts_the_foreground_as_nothing_reserved() -> None:
    result = _trace()
    # 0-2 s: nothing; 2-3 s (prompt): 100; 3-5 s: 100; 5-7 s: 200 -> (100 + 200 + 400) / 7
    assert open_to_last_reserved(result) == pytest.approx(700 / 7)


def test_run_figures_report_the_write_ups_metrics() -> None:
    f = compute(
        _trace(),
        protocol="I2",
        variant="cold-split",
        repetition=0,
        bands_ladder=Ladder((4, 8)),
        peak_rss_bytes=1,
        kv_bytes_per_token=25,
        weights_bytes=1,
        split="device cores 0, host cores 1",
        load_mode="import",
    )
    assert f.reserved_kv_time_weighted_bytes == pytest.approx((100 * 2 + 200 * 2) / 4)
    assert f.reserved_kv_open_to_last_bytes == pytest.approx(100)
    assert f.migration_total_s == pytest.approx(0.010)
    assert f.migration_per_boundary_s == pytest.approx(0.010)
    assert f.migration_per_token_s == pytest.approx(0.010 / 4)
    (b,) = f.boundaries
    assert (b.boundary_at_s, b.ready_at_s, b.slack_s) == (5.0, 4.5, 0.5)
    assert b.deadline_met and b.loaded_in_background
    # Ready costs: the host's whole build plus the import; compiles alone beside them.
    assert f.ready_cost_s == pytest.approx({"decode@4": 1.7, "decode@8": 1.35})
    assert f.compile_s_by_graph == {"decode@4": 1.2, "decode@8": 1.0}
    assert f.first_rung_wall_s == 2.0
    assert (f.split, f.load_mode) == ("device cores 0, host cores 1", "import")
    again = RunFigures.from_json(f.to_json())
    assert again == f and again.boundaries[0].slack_s == 0.5


def test_williams_orders_for_four_protocols_and_five_repetitions() -> None:
    protocols = ("B0", "B1", "I1", "I2")
    orders = williams_orders(list(protocols), 5, seed=0)
    assert len(orders) == 5
    assert all(sorted(o) == sorted(protocols) for o in orders)
    square = orders[:4]
    # A 4x4 Williams square: each protocol once per position...
    for position in range(4):
        assert sorted(o[position] for o in square) == sorted(protocols)
    # ...and each ordered pair of neighbours exactly once.
    pairs = [p for o in square for p in itertools.pairwise(o)]
    assert len(pairs) == len(set(pairs)) == 12
    # N = 5: the rows are cycled, so the fifth repetition repeats the first row.
    assert orders[4] == orders[0]


def test_peak_rss_is_this_process_own_high_water_mark() -> None:
    import resource

    from ovspec.bench.protocols.worker import peak_rss

    peak = peak_rss()
    # VmHWM never exceeds ru_maxrss (which also keeps a pre-exec image's peak).
    assert 0 < peak <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
