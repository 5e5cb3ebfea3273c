"""The sweep page's auto section, from the results' samples alone: per cell, auto's
critical path against the best fixed policy (B0, I1, I2) and against I2, paired by
repetition with 95% intervals and verdicts by the interval's bound, and auto's
boundary waits beside what its plan predicted for each boundary.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ovspec.bench.protocols.metrics import RunFigures
from ovspec.errors import TrialError
from ovspec.runtime.autopolicy import GUARD_RATIO
from ovspec.stats.paired import MOST_PAIRS, PairedSummary, pairs_to_resolve, summarize_pairs

FIXED = ("B0", "I1", "I2")
AUTO = "auto"
NOT_WORSE_RELATIVE = 0.02  # auto - best: the interval's upper end at most +2% of best
WAIT_S = 0.005  # a measured boundary wait shorter than this is the get's own overhead


@dataclass(frozen=True)
class AutoVerdict:
    label: str
    best: str  # the fixed policy with the shortest mean critical path in this cell
    vs_best: PairedSummary | None  # auto (B) against the best (A)
    vs_i2: PairedSummary | None  # auto (B) against I2 (A)
    i2_pays: bool  # I2 faster than I1, interval excluding 0
    schedules: Mapping[str, int]  # auto's chosen schedules, counted over its runs
    unpredicted_waits: tuple[str, ...]  # waits at boundaries the plan gave positive slack
    predicted_waits: tuple[str, ...]  # waits the plan predicted (and what happened)
    predicted_s: float | None  # the plans' last token (median over runs), guard included
    measured_s: float  # auto's critical path (median over the runs with a plan)

    @property
    def not_worse(self) -> bool:
        s = self.vs_best
        return s is not None and s.t_test.ci_high <= NOT_WORSE_RELATIVE * s.mean_a

    @property
    def pairs_to_resolve_not_worse(self) -> int | None:
        """Pairs whose auto − best interval would be +-2% of best wide at the SD these
        pairs show: a floor, as at a true difference of 0 an interval that wide is called
        not worse only about half the time."""
        s = self.vs_best
        return None if s is None else pairs_to_resolve(s, NOT_WORSE_RELATIVE * s.mean_a)

    @property
    def faster_than_i2(self) -> bool:
        return self.vs_i2 is not None and self.vs_i2.t_test.ci_high < 0


def _by_protocol(cell: Mapping[str, Any]) -> dict[str, dict[int, RunFigures]]:
    out: dict[str, dict[int, RunFigures]] = {}
    for data in cell["runs"]:
        run = RunFigures.from_json(data)
        out.setdefault(run.protocol, {})[run.repetition] = run
    return out


def _paired(a: Mapping[int, RunFigures], b: Mapping[int, RunFigures]) -> PairedSummary | None:
    common = sorted(set(a) & set(b))
    try:
        return summarize_pairs(
            [a[k].critical_path_s for k in common], [b[k].critical_path_s for k in common]
        )
    except TrialError:
        return None


def _waits(
    runs: Mapping[int, RunFigures], plans: Mapping[str, Any]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each measured wait beside its boundary's predicted slack: (unpredicted, predicted)."""
    unpredicted: list[str] = []
    predicted: list[str] = []
    for repetition, run in sorted(runs.items()):
        plan = plans.get(str(repetition)) or {}
        slack = {
            (b["from_capacity_tokens"], b["to_capacity_tokens"]): b["slack_s"]
            for b in plan.get("predicted", {}).get("boundaries", [])
        }
        for b in run.boundaries:
            key = (b.from_capacity_tokens, b.to_capacity_tokens)
            planned = slack.get(key)
            where = f"run {repetition} {key[0]}→{key[1]}"
            if planned is not None and planned < 0:
                predicted.append(f"{where}: waited {b.wait_s:.3f} s, predicted {-planned:.3f} s")
            elif b.wait_s > WAIT_S:
                said = "no plan" if planned is None else f"predicted slack {planned:+.3f} s"
                unpredicted.append(f"{where}: waited {b.wait_s:.3f} s ({said})")
    return tuple(unpredicted), tuple(predicted)


def auto_verdict(cell: Mapping[str, Any]) -> AutoVerdict | None:
    """The cell's auto verdict; None when the cell has no auto runs."""
    runs = _by_protocol(cell)
    if AUTO not in runs or not all(p in runs for p in FIXED):
        return None
    best = min(FIXED, key=lambda p: sum(r.critical_path_s for r in runs[p].values()) / len(runs[p]))
    i2_vs_i1 = _paired(runs["I1"], runs["I2"])
    plans = cell.get("auto_plans") or {}
    names = Counter(
        f"{(p or {}).get('schedule', {}).get('name', 'one ahead (no costs)')} on "
        f"{','.join(map(str, (p or {}).get('schedule', {}).get('rungs', [])))}"
        for p in plans.values()
    )
    unpredicted, predicted = _waits(runs[AUTO], plans)
    # Both medians over the repetitions whose plan was kept.
    planned = {
        int(k): p["predicted"]["finished_s"] for k, p in plans.items() if p and "predicted" in p
    }
    measured = [r.critical_path_s for k, r in runs[AUTO].items() if k in planned] or [
        r.critical_path_s for r in runs[AUTO].values()
    ]
    return AutoVerdict(
        label=f"{cell['preset']} / {cell['ladder_name']} / {cell['compression']}",
        best=best,
        vs_best=_paired(runs[best], runs[AUTO]),
        vs_i2=_paired(runs["I2"], runs[AUTO]),
        i2_pays=i2_vs_i1 is not None and i2_vs_i1.t_test.ci_high < 0,
        schedules=dict(names),
        unpredicted_waits=unpredicted,
        predicted_waits=predicted,
        predicted_s=statistics.median(planned.values()) if planned else None,
        measured_s=statistics.median(measured),
    )


def _relative(s: PairedSummary | None) -> str:
    if s is None:
        return "n/a"
    low, high = s.t_test.ci_low / s.mean_a, s.t_test.ci_high / s.mean_a
    return f"{100 * s.relative_change:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}]"


def _predicted(v: AutoVerdict) -> str:
    if v.predicted_s is None:
        return f"no plan → {v.measured_s:.2f}"
    return f"{v.predicted_s:.2f} → {v.measured_s:.2f}"


def _pairs(n: int | None) -> str:
    return "n/a" if n is None else f"{n}"


def _resolution_line(needed: list[int | None], runs: int) -> str:
    """Whether the ±2% bound is within what the sweep's pairs can resolve."""
    known = sorted(n for n in needed if n is not None)
    beyond = len(needed) - len(known)
    span = f"{known[0]}–{known[-1]}" if known else "none"
    return (
        f"Resolution: the sweep ran {runs} pairs per cell; an auto − best interval of ±2% "
        f"would take {span} pairs per cell at the spread measured here"
        + (f" ({beyond} cell(s) past {MOST_PAIRS:,})" if beyond else "")
        + f"; {sum(1 for n in known if n <= runs)} of {len(needed)} cells are resolved at "
        f"{runs}."
    )


def auto_section(cells: list[Mapping[str, Any]]) -> list[str]:
    """The page's lines for auto; empty when no cell ran it."""
    verdicts = [v for v in (auto_verdict(c) for c in cells) if v is not None]
    if not verdicts:
        return []
    lines = [
        "",
        "## auto against the fixed policies",
        "",
        "auto − best fixed and auto − I2: critical path, paired by repetition, mean relative "
        "change [95% CI] (negative: auto is faster). *Not worse*: the interval's upper end "
        f"is at most +{100 * NOT_WORSE_RELATIVE:.0f}% of the best fixed policy's mean (the best "
        "is picked from the same runs). *Pairs for ±2%*: how many pairs would make the "
        "auto − best interval ±2% of best wide at the spread these pairs show, a floor: were "
        "the true difference 0, such an interval would end under +2% about half the time. "
        "*Faster than I2*: the interval excludes 0. *Predicted → measured*: "
        f"auto's last token as its plan predicted it (builds priced at {GUARD_RATIO:g}×, "
        f"steps at 1/{GUARD_RATIO:g} of the known costs) and as it happened, seconds from "
        "the loader's opening (medians over the runs).",
        "",
        "| cell | auto's schedule (runs) | best fixed | auto − best | not worse "
        "| pairs for ±2% | auto − I2 | faster than I2 | I2 pays | predicted → measured s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        chosen = "; ".join(f"{k} ({n})" for k, n in v.schedules.items())
        lines.append(
            f"| {v.label} | {chosen} | {v.best} | {_relative(v.vs_best)} | "
            f"{'yes' if v.not_worse else '**no**'} | {_pairs(v.pairs_to_resolve_not_worse)} | "
            f"{_relative(v.vs_i2)} | "
            f"{'yes' if v.faster_than_i2 else 'no'} | {'yes' if v.i2_pays else 'no'} | "
            f"{_predicted(v)} |"
        )
    no_pay = [v for v in verdicts if not v.i2_pays]
    needed = [v.pairs_to_resolve_not_worse for v in verdicts if v.vs_best is not None]
    runs = min((v.vs_best.n_pairs for v in verdicts if v.vs_best is not None), default=0)
    lines += ["", _resolution_line(needed, runs)] if needed else []
    lines += [
        "",
        f"auto is not worse than the best fixed policy in {sum(v.not_worse for v in verdicts)} "
        f"of {len(verdicts)} cells; where one-ahead does not pay ({len(no_pay)} cells) it is "
        f"faster than I2 in {sum(v.faster_than_i2 for v in no_pay)}.",
        "",
        "### auto's boundary waits against its plan",
        "",
    ]
    unpredicted = [f"- {v.label}, {w}" for v in verdicts for w in v.unpredicted_waits]
    predicted = [f"- {v.label}, {w}" for v in verdicts for w in v.predicted_waits]
    lines.append(
        f"Waits at boundaries the plan gave positive slack (over {WAIT_S * 1000:.0f} ms): "
        f"{len(unpredicted)}."
    )
    lines += ["", *unpredicted] if unpredicted else []
    lines += ["", f"Waits the plan predicted: {len(predicted)}."]
    lines += ["", *predicted] if predicted else []
    return lines
