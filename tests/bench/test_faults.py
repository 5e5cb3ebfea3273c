"""The fault campaign's harness on one cheap class, so the campaign cannot rot between
full runs (``tools/faults.py`` runs them all; docs/benchmarks/reliability.md holds the table)."""

from __future__ import annotations

from pathlib import Path

from ovspec.bench.faults.cases import CASES, prepare
from ovspec.bench.faults.harness import format_table, run_campaign, totals


def test_one_fault_class_runs_through_real_processes(tmp_path: Path) -> None:
    names = ["delete row", "lock holder stopped (SIGSTOP)", "link at tmp"]
    cases = [c for c in CASES if c.name in names]
    assert len(cases) == 3
    results = run_campaign(tmp_path, cases, prepare=prepare)
    assert [r.fault for r in results] == names
    for r in results:
        assert r.ok and r.tokens_equal and r.outside_untouched and r.tracebacks == 0, r
    table = format_table(results)
    assert len(table) == 5 and table[2].startswith("| delete row |")
    assert totals(results).startswith("3 fault classes: 0 with outputs that differ")
