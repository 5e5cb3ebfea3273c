"""The report of an A/B compile trial: paired statistics per rung and overall, the
blob-identity gate, and each arm's environment, as text lines, JSON or a paired plot.

Built from a plan and its recorded runs; the statistics are ``ovspec.stats.paired``'s, and a
trial they cannot summarize honestly (too few pairs, zero variance) is a TrialError.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ovspec.errors import BadRequestError, TrialError
from ovspec.extras import missing_extra
from ovspec.stats.orders import Arm
from ovspec.stats.paired import PairedSummary, summarize_pairs
from ovspec.trials.records import WARMUP_PAIRS, EnvironmentGuard, RunRecord, TrialPlan
from ovspec.trials.runner import measured_records

# Bump when a key of ``report_to_dict`` changes meaning.
# History: 1 — first format (2026-11).
REPORT_FORMAT_VERSION = 1

OVERALL_LABEL = "overall"

_WIDTH = 110  # the statistics tables are this wide


class BlobVerdict(Enum):
    """Did A and B export byte-identical blobs in every measured pair?"""

    IDENTICAL = "identical"
    DIFFERENT = "different"
    MIXED = "mixed"  # identical in some pairs only: a compiler is not deterministic


@dataclass(frozen=True)
class PairTimes:
    """One measured pair: both arms' compile times and whether their blobs matched."""

    pair: int
    first: Arm
    a_wall_s: float
    b_wall_s: float
    a_cpu_s: float
    b_cpu_s: float
    blobs_identical: bool


@dataclass(frozen=True)
class RungResult:
    """A rung's (or, summed per pair, the whole ladder's) paired summaries and gate."""

    label: str
    pairs: tuple[PairTimes, ...]
    wall: PairedSummary
    cpu: PairedSummary
    a_blob_variants: int
    b_blob_variants: int

    @property
    def identical_pairs(self) -> int:
        return sum(p.blobs_identical for p in self.pairs)

    @property
    def verdict(self) -> BlobVerdict:
        if self.identical_pairs == len(self.pairs):
            return BlobVerdict.IDENTICAL
        if self.identical_pairs == 0:
            return BlobVerdict.DIFFERENT
        return BlobVerdict.MIXED


@dataclass(frozen=True)
class TrialReport:
    """Everything ``ovspec ab-compile`` prints about a complete trial."""

    plan: TrialPlan
    results_path: Path
    rungs: tuple[RungResult, ...]
    overall: RungResult | None  # None with one rung: it would repeat that rung
    environments: Mapping[Arm, Mapping[str, Any]]
    runs_per_arm: Mapping[Arm, int]
    notes: tuple[str, ...]

    @property
    def n_pairs(self) -> int:
        return self.plan.pairs

    @property
    def a_first_pairs(self) -> int:
        return sum(p.first is Arm.A for p in self.rungs[0].pairs)


def _summarize(label: str, what: str, a: Sequence[float], b: Sequence[float]) -> PairedSummary:
    try:
        return summarize_pairs(a, b, unit="s")
    except TrialError as exc:
        raise TrialError(f"{label} {what}: {exc}") from exc


def _rung_result(label: str, pairs: Sequence[PairTimes], a_blobs: int, b_blobs: int) -> RungResult:
    return RungResult(
        label=label,
        pairs=tuple(pairs),
        wall=_summarize(
            label, "compile wall time", [p.a_wall_s for p in pairs], [p.b_wall_s for p in pairs]
        ),
        cpu=_summarize(
            label, "compile CPU time", [p.a_cpu_s for p in pairs], [p.b_cpu_s for p in pairs]
        ),
        a_blob_variants=a_blobs,
        b_blob_variants=b_blobs,
    )


def _library_identity(env: Mapping[str, Any]) -> dict[str, str]:
    libs = env.get("libraries", {})
    return {os.path.basename(k): v for k, v in libs.items()} if isinstance(libs, dict) else {}


def build_report(plan: TrialPlan, records: Sequence[RunRecord], results_path: Path) -> TrialReport:
    """Summarize a complete trial; the warm-up pair and runs beyond ``plan.pairs`` are
    left out. The overall row sums each pair's compile times over the rungs: the time
    to compile the whole ladder under A vs under B."""
    guard = EnvironmentGuard()
    for record in records:
        guard.admit(record)
    runs = measured_records(plan, records)
    orders = plan.orders()
    pair_range = range(WARMUP_PAIRS, WARMUP_PAIRS + plan.pairs)
    rungs: list[RungResult] = []
    for spec in plan.specializations:
        label = spec.label
        pairs = []
        for pair in pair_range:
            a, b = runs[(pair, label, "A")], runs[(pair, label, "B")]
            pairs.append(
                PairTimes(
                    pair=pair,
                    first=orders[pair][0],
                    a_wall_s=a.wall_s,
                    b_wall_s=b.wall_s,
                    a_cpu_s=a.cpu_s,
                    b_cpu_s=b.cpu_s,
                    blobs_identical=a.blob_xxh3 == b.blob_xxh3,
                )
            )
        a_hashes = {runs[(p, label, "A")].blob_xxh3 for p in pair_range}
        b_hashes = {runs[(p, label, "B")].blob_xxh3 for p in pair_range}
        rungs.append(_rung_result(label, pairs, len(a_hashes), len(b_hashes)))
    overall = None
    if len(rungs) > 1:
        summed = [
            PairTimes(
                pair=pair,
                first=orders[pair][0],
                a_wall_s=sum(r.pairs[i].a_wall_s for r in rungs),
                b_wall_s=sum(r.pairs[i].b_wall_s for r in rungs),
                a_cpu_s=sum(r.pairs[i].a_cpu_s for r in rungs),
                b_cpu_s=sum(r.pairs[i].b_cpu_s for r in rungs),
                blobs_identical=all(r.pairs[i].blobs_identical for r in rungs),
            )
            for i, pair in enumerate(pair_range)
        ]
        overall = _rung_result(
            OVERALL_LABEL,
            summed,
            max(r.a_blob_variants for r in rungs),
            max(r.b_blob_variants for r in rungs),
        )
    environments = {arm: env for arm in Arm if (env := guard.environment(arm)) is not None}
    counts = {arm: sum(r.arm is arm for r in records) for arm in Arm}
    return TrialReport(
        plan=plan,
        results_path=results_path,
        rungs=tuple(rungs),
        overall=overall,
        environments=environments,
        runs_per_arm=counts,
        notes=tuple(_notes(plan, rungs, environments)),
    )


def _notes(
    plan: TrialPlan, rungs: Sequence[RungResult], envs: Mapping[Arm, Mapping[str, Any]]
) -> list[str]:
    notes = []
    a, b = envs.get(Arm.A, {}), envs.get(Arm.B, {})
    if _library_identity(a) == _library_identity(b) and a.get("openvino") == b.get("openvino"):
        notes.append(
            "A and B loaded byte-identical OpenVINO libraries: this trial compares their "
            "compile properties and environment variables, not two compiler builds"
        )
    for rung in rungs:
        if rung.a_blob_variants > 1 or rung.b_blob_variants > 1:
            notes.append(
                f"{rung.label}: an arm exported different blobs from the same input across "
                f"pairs (A {rung.a_blob_variants}, B {rung.b_blob_variants} variants): "
                "its compiler is not deterministic, so the blob gate cannot vouch for a patch"
            )
    floor = rungs[0].wall.sign_flip.min_attainable_p
    if floor > 0.05:
        notes.append(
            f"{plan.pairs} pairs cannot reach a sign-flip p below {floor:.4g}; run more "
            "pairs (6 reach 0.03125) before reading p as evidence"
        )
    return notes


# --------------------------------------------------------------------------- text


def _row(label: str, s: PairedSummary) -> str:
    t, f = s.t_test, s.sign_flip
    return (
        f"{label:<18} {s.n_pairs:>3} {s.mean_a:>9.4f} {s.mean_b:>9.4f} {s.mean_diff:>+10.4f} "
        f"{s.median_diff:>+10.4f} {s.relative_change:>+8.1%} "
        f"{f'{s.b_faster_pairs}/{s.n_pairs}':>8} "
        f"{f'[{t.ci_low:+.4f}, {t.ci_high:+.4f}]':>21} {t.p_value:>8.3g} "
        f"{f.p_value:>9.4g} {f.min_attainable_p:>8.4g}"
    )


_HEADER = (
    f"{'rung':<18} {'n':>3} {'mean A':>9} {'mean B':>9} {'mean B−A':>10} {'median B−A':>10} "
    f"{'change':>8} {'B faster':>8} {'95% CI of B−A (t)':>21} {'t p':>8} "
    f"{'sign-flip p':>9} {'min p':>8}"
)


def _table(title: str, report: TrialReport, cpu: bool) -> list[str]:
    lines = [title, _HEADER]
    for rung in (*report.rungs, *([report.overall] if report.overall else [])):
        label = rung.label if rung.label != OVERALL_LABEL else "overall (Σ rungs)"
        lines.append(_row(label, rung.cpu if cpu else rung.wall))
    return lines


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=_WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _environment_lines(
    arm: Arm, env: Mapping[str, Any], runs: int, same_libraries_as: Arm | None
) -> list[str]:
    head = (
        f"{arm.value}: {runs} runs, one environment: openvino {env.get('openvino')}; "
        f"{env.get('device_version')}; python {env.get('python')} {env.get('python_version')}"
    )
    lines = _wrap(head, "  ", "     ")
    libs = env.get("libraries", {})
    if same_libraries_as is not None:
        lines.append(f"     libraries: the same files as {same_libraries_as.value} (paths, hashes)")
    elif isinstance(libs, dict):
        folders = sorted({os.path.dirname(p) for p in libs})
        names = ", ".join(f"{os.path.basename(p)}={h[:10]}" for p, h in sorted(libs.items()))
        lines += _wrap(
            f"libraries (name=xxh3) from {', '.join(folders)}: {names}", "     ", "       "
        )
    return lines


def format_report(report: TrialReport) -> list[str]:
    """The human report; the caller prints it."""
    plan = report.plan
    a_first = report.a_first_pairs
    lines = [
        f"ab-compile  {plan.model.root}  (model digest {plan.model_digest[:12]})",
        f"device {plan.device}   results {report.results_path}",
        f"pairs: {plan.pairs} measured + {WARMUP_PAIRS} warm-up (excluded); order AB/BA "
        f"alternating from seed {plan.seed}: A first in {a_first}/{plan.pairs}, "
        f"B first in {plan.pairs - a_first}/{plan.pairs}; one fresh process per compile, "
        "CACHE_DIR off, store bypassed",
        "arms:",
        f"  A {plan.arm_a.label}: {plan.arm_a.describe()}",
        f"  B {plan.arm_b.label}: {plan.arm_b.describe()}",
        "environment (recorded by every run; checked identical within each arm):",
    ]
    host = report.environments.get(Arm.A, {})
    lines.append(f"  host {host.get('host')}, {host.get('cpu_model')}, kernel {host.get('kernel')}")
    for arm, env in report.environments.items():
        other = report.environments.get(arm.other)
        same = arm is Arm.B and other is not None and other.get("libraries") == env.get("libraries")
        lines += _environment_lines(
            arm, env, report.runs_per_arm.get(arm, 0), arm.other if same else None
        )
    lines.append("")
    lines += _table("compile wall time, seconds (difference B − A per pair)", report, cpu=False)
    lines.append("")
    lines += _table(
        "compile CPU time of the process, seconds (all threads; B − A per pair)",
        report,
        cpu=True,
    )
    lines += [
        "",
        "blob identity (A's and B's exported bytes, xxh3-128, per measured pair):",
        f"{'rung':<18} {'identical':>9} {'A variants':>10} {'B variants':>10}  verdict",
    ]
    for rung in report.rungs:
        lines.append(
            f"{rung.label:<18} {f'{rung.identical_pairs}/{len(rung.pairs)}':>9} "
            f"{rung.a_blob_variants:>10} {rung.b_blob_variants:>10}  {rung.verdict.value}"
        )
    legend = (
        "change = mean(B − A) / mean(A); B faster = pairs with B < A; t p = paired-t "
        "two-sided p; sign-flip p = exact two-sided permutation p over all 2^n sign "
        "patterns; min p = the smallest sign-flip p n pairs can give."
    )
    lines += ["", *_wrap(legend, "", "")]
    for note in report.notes:
        lines += _wrap(note, "note: ", "  ")
    return lines


# --------------------------------------------------------------------------- JSON


def _rung_dict(rung: RungResult) -> dict[str, Any]:
    return {
        "specialization": rung.label,
        "wall": rung.wall.to_dict(),
        "cpu": rung.cpu.to_dict(),
        "blob_identity": {
            "identical_pairs": rung.identical_pairs,
            "n_pairs": len(rung.pairs),
            "verdict": rung.verdict.value,
            "a_variants": rung.a_blob_variants,
            "b_variants": rung.b_blob_variants,
        },
        "pairs": [
            {
                "pair": p.pair,
                "first": p.first.value,
                "a_wall_s": p.a_wall_s,
                "b_wall_s": p.b_wall_s,
                "a_cpu_s": p.a_cpu_s,
                "b_cpu_s": p.b_cpu_s,
                "blobs_identical": p.blobs_identical,
            }
            for p in rung.pairs
        ],
    }


def report_to_dict(report: TrialReport) -> dict[str, Any]:
    """JSON-ready form; ``format`` is ``REPORT_FORMAT_VERSION``."""
    plan = report.plan
    return {
        "format": REPORT_FORMAT_VERSION,
        "model": str(plan.model.root),
        "model_digest": plan.model_digest,
        "device": plan.device,
        "results": str(report.results_path),
        "pairs": plan.pairs,
        "warmup_pairs": WARMUP_PAIRS,
        "seed": plan.seed,
        "orders": ["".join(a.value for a in order) for order in plan.orders()],
        "arms": {
            arm.value: {
                **plan.arm(arm).to_dict(),
                "runs": report.runs_per_arm.get(arm, 0),
                "environment": dict(report.environments.get(arm, {})),
            }
            for arm in Arm
        },
        "rungs": [_rung_dict(r) for r in report.rungs],
        "overall": _rung_dict(report.overall) if report.overall else None,
        "notes": list(report.notes),
    }


# --------------------------------------------------------------------------- plot


def write_plot(report: TrialReport, path: Path) -> None:
    """A PNG: one panel per rung (and overall) for wall and CPU time, one line per pair
    from its A time to its B time, coloured by which arm ran first."""
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise missing_extra("bench", "ab-compile's plot") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*report.rungs, *([report.overall] if report.overall else [])]
    fig, axes = plt.subplots(2, len(panels), figsize=(3.2 * len(panels) + 0.8, 7.0), squeeze=False)
    a_label, b_label = report.plan.arm_a.label, report.plan.arm_b.label
    for col, rung in enumerate(panels):
        for row, (what, summary) in enumerate((("wall", rung.wall), ("CPU", rung.cpu))):
            ax = axes[row][col]
            for p in rung.pairs:
                a, b = (p.a_wall_s, p.b_wall_s) if row == 0 else (p.a_cpu_s, p.b_cpu_s)
                colour = "tab:blue" if p.first is Arm.A else "tab:orange"
                ax.plot([0, 1], [a, b], marker="o", color=colour, alpha=0.8, linewidth=1.2)
            ax.set_xticks([0, 1], [f"A\n{a_label}", f"B\n{b_label}"])
            ax.set_xlim(-0.3, 1.3)
            s = summary
            ax.set_title(
                f"{rung.label} {what}\nΔ {s.mean_diff:+.3g} s ({s.relative_change:+.1%}), "
                f"p={s.sign_flip.p_value:.3g}",
                fontsize=9,
            )
            if col == 0:
                ax.set_ylabel(f"compile {what} time (s)")
            ax.grid(alpha=0.3)
    fig.suptitle(
        f"ab-compile on {report.plan.device}: {report.plan.pairs} pairs "
        "(blue: A ran first, orange: B ran first)",
        fontsize=10,
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise BadRequestError(f"cannot write plot {path}: {exc.strerror}") from exc
    finally:
        plt.close(fig)
