"""The bench page's sections over saved runs: the results document read back as
``RunFigures``, paired summaries, the plan's predicted slack against the measured one,
the cost of sharing the cores, B1 against B0 and I1 per band, and boundary agreement.
``protocols.page`` assembles the page from these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.bench.protocols.metrics import RunFigures, median
from ovspec.errors import TrialError
from ovspec.ladder import Ladder
from ovspec.runtime.plan import RungCosts, plan_one_ahead
from ovspec.stats.paired import PairedSummary, summarize_pairs

# -- reading the document -----------------------------------------------------------


class Runs:
    def __init__(self, document: Mapping[str, Any]) -> None:
        self.runs = [RunFigures.from_json(r) for r in document["runs"]]

    def select(self, arm: str, protocol: str) -> list[RunFigures]:
        return sorted(
            (r for r in self.runs if r.variant == arm and r.protocol == protocol),
            key=lambda r: r.repetition,
        )

    def pairs(
        self, arm: str, a: str, b: str, value: Any, arm_b: str | None = None
    ) -> tuple[list[float], list[float]]:
        first = {r.repetition: r for r in self.select(arm, a)}
        second = {r.repetition: r for r in self.select(arm_b or arm, b)}
        common = sorted(set(first) & set(second))
        return [float(value(first[i])) for i in common], [float(value(second[i])) for i in common]


def summary(xs: Sequence[float], ys: Sequence[float]) -> PairedSummary | None:
    try:
        return summarize_pairs(list(xs), list(ys), unit="s")
    except TrialError:
        return None


def effect(s: PairedSummary | None) -> str:
    if s is None:
        return "n/a (fewer than 2 pairs)"
    return f"{s.mean_diff:+.2f} s · {100 * s.relative_change:+.2f}%"


def ci(s: PairedSummary | None, scale: float = 1.0, unit: str = "s") -> str:
    if s is None:
        return "n/a"
    return f"[{scale * s.t_test.ci_low:+.3f}, {scale * s.t_test.ci_high:+.3f}] {unit}"


def med(runs: Sequence[RunFigures], value: Any) -> float:
    return median([float(value(r)) for r in runs])


def successor_compile_s(r: RunFigures, first: int) -> float:
    """Compile seconds of graphs loaded in the background (successors), as recorded."""
    return sum(v for k, v in compiles(r).items() if int(k.split("@")[1].split("x")[0]) != first)


def compiles(r: RunFigures) -> dict[str, float]:
    return dict(r.compile_s_by_graph)


def predicted_slack(i1: RunFigures, i2: RunFigures, cfg: Mapping[str, Any]) -> list[float]:
    """The plan's slack per boundary for I2's run, from the I1 control's measured costs:
    each rung's ready cost (build + import) and its decode ms per token."""
    ladder = Ladder(tuple(cfg["ladder"]))
    prompt, new = int(cfg["prompt_tokens"]), int(cfg["new_tokens"])
    decode = {
        b.high_tokens: b.infer_s / b.steps for b in i1.bands if b.steps and b.high_tokens in ladder
    }
    compile_s = {
        int(k.split("@")[1]): v for k, v in i1.ready_cost_s.items() if k.startswith("decode@")
    }
    prefill = [v for k, v in i1.ready_cost_s.items() if k.startswith("prefill@")]
    costs = RungCosts(
        compile_s=compile_s,
        decode_s_per_token=decode,
        prefill_compile_s=prefill[0] if prefill else 0.0,
        prefill_s=i1.prefill_s,
    )
    plan = plan_one_ahead(ladder, prompt, new, costs)
    del i2
    return [b.slack_s for b in plan.boundaries]


def slack_table(document: Mapping[str, Any], runs: Runs, arm: str) -> list[str]:
    cfg = document["config"]
    i1 = {r.repetition: r for r in runs.select(arm, "I1")}
    rows: dict[str, list[tuple[float, float]]] = {}
    for r in runs.select(arm, "I2"):
        control = i1.get(r.repetition)
        if control is None:
            continue
        try:
            predicted = predicted_slack(control, r, cfg)
        except Exception as exc:  # a control without a cost the plan needs
            return [f"(no prediction: {exc})"]
        for b, p in zip(r.boundaries, predicted, strict=False):
            rows.setdefault(f"{b.from_capacity_tokens}→{b.to_capacity_tokens}", []).append(
                (p, b.slack_s)
            )
    lines = [
        "| boundary | predicted slack s | measured slack s | error s (measured − predicted) |",
        "|---|---|---|---|",
    ]
    for label, pairs in rows.items():
        pred = median([p for p, _ in pairs])
        meas = median([m for _, m in pairs])
        err = median([m - p for p, m in pairs])
        lines.append(f"| {label} | {pred:+.2f} | {meas:+.2f} | {err:+.2f} |")
    lines += [
        "",
        "Predicted: `ovspec plan`'s simulation (`plan_one_ahead`) of I2's run from the I1 "
        "control of the same repetition: each rung's measured ready cost (build + import, "
        "taken while nothing decoded) and decode time per token on it. Measured: the boundary "
        "minus the moment the successor's graph was loaded. Medians over repetitions. A "
        "negative error means the successor was ready later than predicted: a build "
        "overlapping the decode runs slower than the same build at start-up.",
    ]
    return lines


def sharing(runs: Runs, cfg: Mapping[str, Any], arms: Sequence[str]) -> list[str]:
    split, shared = arms[0], arms[1]
    lines = [
        f"| protocol | critical s ({split}) | critical s ({shared}) | shared − split, paired "
        "| decode s (split) | decode s (shared) | shared − split, paired |",
        "|---|---|---|---|---|---|---|",
    ]
    for protocol in cfg["protocols"]:
        cp = runs.pairs(split, protocol, protocol, lambda r: r.critical_path_s, arm_b=shared)
        de = runs.pairs(split, protocol, protocol, lambda r: r.decode_s, arm_b=shared)
        if not cp[0]:
            continue
        s_cp, s_de = summary(*cp), summary(*de)
        lines.append(
            f"| {protocol} | {median(cp[0]):.2f} | {median(cp[1]):.2f} | {effect(s_cp)}, CI "
            f"{ci(s_cp)} | {median(de[0]):.2f} | {median(de[1]):.2f} | {effect(s_de)}, CI "
            f"{ci(s_de)} |"
        )
    cp_split = summary(*runs.pairs(split, "I1", "I2", lambda r: r.critical_path_s))
    cp_shared = summary(*runs.pairs(shared, "I1", "I2", lambda r: r.critical_path_s))
    de_shared = summary(*runs.pairs(shared, "I1", "I2", lambda r: r.decode_s))
    de_split = summary(*runs.pairs(split, "I1", "I2", lambda r: r.decode_s))
    lines += [
        "",
        f"I2 − I1 critical path: split {effect(cp_split)} (CI {ci(cp_split)}), shared "
        f"{effect(cp_shared)} (CI {ci(cp_shared)}); I2 − I1 decode, shared: "
        f"{effect(de_shared)} (CI {ci(de_shared)}); split: {effect(de_split)} (CI "
        f"{ci(de_split)}). What differs between the arms: shared, the decode runs "
        "OpenVINO's threads on both cores and a build runs on the loader's thread at a lower "
        "priority (nice 10) on the same cores, so the decode wins them and the build gets "
        "what is left (eager protocols also build two graphs at once in their foreground); "
        "split, the decode has one core and one thread, and a build has a whole core of its "
        "own (what host-core work costs the split's decode is measured on its own page, "
        "[overlap.md](overlap.md)), so I2 − I1 decode under the split is mostly the "
        "machine's run-to-run drift, which its CI shows. So "
        "the cost of sharing is the first column pair (positive: sharing is slower), and "
        "the split's price is its one decode core.",
    ]
    return lines


def bands(document: Mapping[str, Any], runs: Runs, arm: str) -> list[str]:
    b0, b1, i1 = runs.select(arm, "B0"), runs.select(arm, "B1"), runs.select(arm, "I1")
    if not b0 or not b1 or not i1:
        return ["(B0, B1 and I1 did not all run)"]
    memcpy = float(document["memcpy_bytes_per_s"])
    per_token = b1[0].kv_bytes_per_token
    lines = [
        "| band | B0 ms/token | B1 ms/token | I1 ms/token | B1 / B0 | B1 − I1 ms | "
        "copy of the band's max KV at memcpy speed, ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, band in enumerate(b0[0].bands):
        x, y, z = (
            median([r.bands[index].step_ms for r in rs if r.bands[index].steps])
            for rs in (b0, b1, i1)
        )
        copy_ms = 1000 * per_token * band.high_tokens / memcpy if memcpy > 0 else float("nan")
        lines.append(
            f"| {band.band} | {x:.2f} | {y:.2f} | {z:.2f} | {y / x:.3f} | {y - z:+.2f} | "
            f"{copy_ms:.2f} |"
        )
    lines += [
        "",
        "B1 and I1 run the same graph in each band (the rung's own capacity); only the KV "
        "binding differs. Before this issue B1 bound strided views into its top-rung buffer "
        "(each head's rows a top rung apart) and could not warm its graphs up (OpenVINO "
        "2026.4's CPU plugin corrupts its heap when a compiled model runs dense inputs and "
        "then strided ones), which made it slower than B0 in the 1K-1.8K bands of the issue-3 "
        "page. It now binds dense views of the same buffer (rung C's past is the first "
        "C-rung's worth of it) and re-strides the live KV in place at a boundary, so it warms "
        "up like the others: B1 − I1 is what is left of the difference (the in-place "
        "re-stride is in B1's migration column above), and the last column is what one copy "
        "of the band's largest KV costs at memcpy bandwidth, for scale. B0 runs the top "
        "rung's graph in every band.",
    ]
    return lines


def agreement_counts(document: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per arm and protocol: boundaries compared, top-1 equal, the lowest cosine. Counted
    from every boundary's record; results from before those were kept give the counts."""
    records = document.get("boundary_logits")
    if records is None:
        counts: dict[str, dict[str, dict[str, Any]]] = document["agreement"]
        return counts
    return {
        arm: {
            protocol: {
                "compared": len(rows),
                "top1_equal": sum(bool(r["top1_equal"]) for r in rows),
                "min_cosine": min((float(r["cosine"]) for r in rows), default=float("nan")),
            }
            for protocol, rows in per.items()
        }
        for arm, per in records.items()
    }


def agreement(document: Mapping[str, Any]) -> list[str]:
    lines = ["| arm | protocol | top-1 equal | min cosine |", "|---|---|---|---|"]
    # Sorted: the results file is saved with sorted keys, so the page must not depend on
    # the order the run filled them in.
    for arm, per in sorted(agreement_counts(document).items()):
        for protocol, a in sorted(per.items()):
            lines.append(
                f"| {arm} | {protocol} | {a['top1_equal']}/{a['compared']} | "
                f"{a['min_cosine']:.7f} |"
            )
    return lines
