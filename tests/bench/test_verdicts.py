"""A page's verdicts follow the interval's bound, never the point estimate; the bench and
KV pages say "not established" where the interval straddles their tolerance."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ovspec.bench.common import pages
from ovspec.bench.common.verdicts import (
    Interval,
    Verdict,
    at_least,
    at_most,
    combined,
    paired_ratio,
    paired_relative_change,
    within,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_at_most_reads_the_upper_end() -> None:
    assert at_most(Interval(0.9, 0.85, 0.99), 1.0) is Verdict.MET
    assert at_most(Interval(0.98, 0.9, 1.05), 1.0) is Verdict.NOT_ESTABLISHED
    assert at_most(Interval(1.2, 1.1, 1.3), 1.0) is Verdict.NOT_MET
    assert at_most(None, 1.0) is Verdict.NOT_ESTABLISHED


def test_at_least_reads_the_lower_end() -> None:
    assert at_least(Interval(0.7, 0.6, 0.8), 0.5) is Verdict.MET
    assert at_least(Interval(0.7, 0.4, 0.8), 0.5) is Verdict.NOT_ESTABLISHED
    assert at_least(Interval(0.3, 0.2, 0.4), 0.5) is Verdict.NOT_MET


def test_a_point_estimate_inside_a_tolerance_is_not_enough() -> None:
    assert within(Interval(0.0002, -0.13, 0.13), 0.0, 0.02) is Verdict.NOT_ESTABLISHED
    assert within(Interval(0.001, -0.01, 0.015), 0.0, 0.02) is Verdict.MET
    assert within(Interval(0.05, 0.03, 0.07), 0.0, 0.02) is Verdict.NOT_MET
    assert combined([Verdict.MET, Verdict.NOT_ESTABLISHED]) is Verdict.NOT_ESTABLISHED
    assert combined([Verdict.MET, Verdict.NOT_MET]) is Verdict.NOT_MET
    assert combined([]) is Verdict.NOT_ESTABLISHED


def test_the_paired_ratio_is_the_geometric_mean_with_its_interval() -> None:
    ratio = paired_ratio([(1.0, 1.1), (2.0, 2.2), (1.5, 1.71)])
    assert ratio is not None
    assert ratio.low < 1.1 < ratio.high
    assert abs(ratio.estimate - (1.1 * 1.1 * 1.14) ** (1 / 3)) < 1e-9
    assert paired_ratio([(1.0, 1.1)]) is None  # one pair: no interval
    change = paired_relative_change([(10.0, 10.5), (10.0, 10.4), (10.0, 10.6)])
    assert change is not None and abs(change.estimate - 0.05) < 1e-9


def test_the_bench_page_does_not_call_a_wide_decode_interval_met() -> None:
    document = json.loads(pages.results_path(DOCS, "bench").read_text(encoding="utf-8"))
    text = pages.renderer("bench")(document)
    line = next(x for x in text.splitlines() if x.startswith("| I2's decode within 2%"))
    assert line.endswith("| **not established** |"), line
    # Squeeze every I2 decode onto its I1 control (plus a wobble): now the interval fits.
    tight = copy.deepcopy(document)
    controls = {
        (r["variant"], r["repetition"]): r["decode_s"]
        for r in tight["runs"]
        if r["protocol"] == "I1"
    }
    for k, r in enumerate(tight["runs"]):
        if r["protocol"] == "I2":
            r["decode_s"] = controls[(r["variant"], r["repetition"])] * (1 + 0.001 * (k % 3))
    text = pages.renderer("bench")(tight)
    line = next(x for x in text.splitlines() if x.startswith("| I2's decode within 2%"))
    assert line.endswith("| **met** |"), line


def test_the_kv_page_decides_its_bands_by_their_intervals() -> None:
    document = json.loads(pages.results_path(DOCS, "kv").read_text(encoding="utf-8"))
    text = pages.renderer("kv")(document)
    assert "| decode step within 2% of copy-and-grow's" in text
    band_line = next(x for x in text.splitlines() if x.startswith("| decode step within 2%"))
    assert band_line.endswith("| **not established** |")
    time_line = next(x for x in text.splitlines() if x.startswith("| physical KV time-weighted"))
    assert time_line.endswith("| **not established** |")
    narrow = copy.deepcopy(document)
    for rows in narrow["part2"]["bands"].values():
        for r in rows:
            r["ci_low"], r["ci_high"] = -0.01, 0.01
    text = pages.renderer("kv")(narrow)
    band_line = next(x for x in text.splitlines() if x.startswith("| decode step within 2%"))
    assert band_line.endswith("| **met** |")
