"""The ab-compile page (docs/benchmarks/ab-compile.md), rendered from the raw run records
``ovspec ab-compile`` appends to its results file (a header line, then one line per
compile), saved whole per trial in results/ab-compile.json. Every figure is recomputed
from the runs: paired compile times per rung and overall with their 95% intervals, and
the blob-identity gate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.errors import TrialError
from ovspec.stats.paired import PairedSummary, summarize_pairs

PAGE = "ab-compile"


def _pairs(
    runs: Sequence[Mapping[str, Any]], label: str
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """A and B of each measured pair (the warm-up left out), in pair order."""
    by_key = {(r["pair"], r["arm"]): r for r in runs if r["specialization"] == label}
    pairs = sorted({p for p, _ in by_key if not by_key[(p, "A")]["warmup"]} if by_key else set())
    return [(by_key[(p, "A")], by_key[(p, "B")]) for p in pairs if (p, "B") in by_key]


def _summary(a: Sequence[float], b: Sequence[float]) -> PairedSummary | None:
    try:
        return summarize_pairs(list(a), list(b), unit="s")
    except TrialError:
        return None


def _row(label: str, s: PairedSummary | None) -> str:
    if s is None:
        return f"| {label} | – | – | – | – | no interval (too few pairs or no spread) | – | – |"
    t, f = s.t_test, s.sign_flip
    return (
        f"| {label} | {s.n_pairs} | {s.mean_a:.4f} | {s.mean_b:.4f} | {s.mean_diff:+.4f} "
        f"({100 * s.relative_change:+.1f}%) | [{t.ci_low:+.4f}, {t.ci_high:+.4f}] | "
        f"{s.b_faster_pairs}/{s.n_pairs} | {f.p_value:.4g} (min {f.min_attainable_p:.4g}) |"
    )


def _reading(s: PairedSummary | None) -> str:
    if s is None:
        return "no interval"
    low, high = s.t_test.ci_low, s.t_test.ci_high
    floor = s.sign_flip.min_attainable_p
    caveat = (
        f" (but {s.n_pairs} pairs cannot give a sign-flip p below {floor:.4g}: too few to lean on)"
        if floor > 0.05
        else f" (sign-flip p {s.sign_flip.p_value:.4g})"
    )
    if low > 0:
        return "B slower: the whole 95% interval is above 0" + caveat
    if high < 0:
        return "B faster: the whole 95% interval is below 0" + caveat
    return "no difference established: the 95% interval includes 0"


def _trial_figures(trial: Mapping[str, Any]) -> dict[str, Any]:
    header, runs = trial["header"], trial["runs"]
    labels: list[str] = list(header["specializations"])
    per_rung = {label: _pairs(runs, label) for label in labels}
    n = min(len(p) for p in per_rung.values())
    wall = {
        lab: _summary([a["wall_s"] for a, _ in p], [b["wall_s"] for _, b in p])
        for lab, p in per_rung.items()
    }
    cpu = {
        lab: _summary([a["cpu_s"] for a, _ in p], [b["cpu_s"] for _, b in p])
        for lab, p in per_rung.items()
    }
    overall_wall = _summary(
        [sum(per_rung[lab][i][0]["wall_s"] for lab in labels) for i in range(n)],
        [sum(per_rung[lab][i][1]["wall_s"] for lab in labels) for i in range(n)],
    )
    identical = {
        lab: sum(a["blob_xxh3"] == b["blob_xxh3"] for a, b in p) for lab, p in per_rung.items()
    }
    variants = {
        lab: (len({a["blob_xxh3"] for a, _ in p}), len({b["blob_xxh3"] for _, b in p}))
        for lab, p in per_rung.items()
    }
    return {
        "labels": labels,
        "pairs": n,
        "wall": wall,
        "cpu": cpu,
        "overall_wall": overall_wall,
        "identical": identical,
        "variants": variants,
        "a_first": sum(a["position"] == 0 for a, _ in per_rung[labels[0]]),
    }


def _gate(identical: int, pairs: int) -> str:
    if identical == pairs:
        return "identical"
    return "different" if identical == 0 else "mixed"


def _arm_text(arm: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    config = ", ".join(f"`{k}={v}`" for k, v in sorted(arm["config"].items())) or "no properties"
    return (
        f"{arm['label']}: {config}; OpenVINO {env.get('openvino', '?')}, "
        f"python {env.get('python_version', '?')}"
    )


def _trial(trial: Mapping[str, Any], figures: Mapping[str, Any]) -> list[str]:
    header, runs = trial["header"], trial["runs"]
    env: dict[str, Mapping[str, Any]] = {
        arm: next((r["environment"] for r in runs if r["arm"] == arm), {}) for arm in "AB"
    }
    labels = figures["labels"]
    lines = [
        f"## {trial['title']}",
        "",
        trial["purpose"],
        "",
        "```sh",
        trial["command"],
        "```",
        "",
        f"- A {_arm_text(header['arms']['A'], env['A'])}",
        f"- B {_arm_text(header['arms']['B'], env['B'])}",
        f"- {figures['pairs']} measured pairs after {header['warmup_pairs']} warm-up pair(s), "
        f"AB/BA alternating from seed {header['seed']} (A first in {figures['a_first']}/"
        f"{figures['pairs']}); one fresh process per compile; device {header['device']}.",
        "",
        "| rung | n | mean A s | mean B s | B − A s (change) | 95% CI of B − A | B faster | "
        "sign-flip p |",
        "|---|---|---|---|---|---|---|---|",
        *(_row(f"{lab} wall", figures["wall"][lab]) for lab in labels),
        *(_row(f"{lab} CPU", figures["cpu"][lab]) for lab in labels),
    ]
    if len(labels) > 1:
        lines.append(_row("overall (Σ rungs) wall", figures["overall_wall"]))
    lines += [
        "",
        "| rung | A and B blobs identical | A variants | B variants | gate |",
        "|---|---|---|---|---|",
    ]
    for lab in labels:
        same, (va, vb) = figures["identical"][lab], figures["variants"][lab]
        lines.append(
            f"| {lab} | {same}/{figures['pairs']} | {va} | {vb} | {_gate(same, figures['pairs'])} |"
        )
    return lines


def render(document: Mapping[str, Any]) -> str:
    trials = document["trials"]
    env: Mapping[str, Any] = document["environment"]
    figures = [_trial_figures(t) for t in trials]
    lines = [
        "# Compiler A/B trials (issue 4)",
        "",
        "Generated by the command below from `results/ab-compile.json` (each trial's run "
        "records as `ovspec ab-compile` wrote them); do not edit by hand. Compile times are "
        "paired per pair (B − A) with a paired-t 95% interval and the exact sign-flip p; a "
        "difference is read only from its interval.",
        "",
    ]
    for trial, f in zip(trials, figures, strict=True):
        overall = f["overall_wall"] if len(f["labels"]) > 1 else f["wall"][f["labels"][0]]
        gates = ", ".join(f"{lab} {_gate(f['identical'][lab], f['pairs'])}" for lab in f["labels"])
        effect = (
            "n/a"
            if overall is None
            else f"{overall.mean_diff:+.4f} s ({100 * overall.relative_change:+.1f}%), 95% CI "
            f"[{overall.t_test.ci_low:+.4f}, {overall.t_test.ci_high:+.4f}] s"
        )
        lines.append(
            f"- {trial['title']}: compile wall B − A {effect}: {_reading(overall)}; blobs {gates}."
        )
    lines += [
        "",
        "```sh",
        document["command"],
        "```",
        "",
        f"Machine: {env.get('cpu_model', '?')}, {env.get('usable_cores', '?')} usable cores; "
        f"ovspec at {env.get('git_commit', '?')}, {env.get('date_utc', '?')}; "
        f"model `{document['model']}`; wall {document['wall_s'] / 60:.1f} min.",
    ]
    for trial, f in zip(trials, figures, strict=True):
        lines += ["", *_trial(trial, f)]
    lines += [
        "",
        "B faster: pairs with B < A. The sign-flip p is exact over all 2^n sign patterns; "
        "*min* is the smallest p n pairs can give. On an NPU the same command compares two "
        "compiler builds given as arms (`--arms arms.toml`, see patches/README.md); the gate "
        "then says whether a patch left the blobs byte-identical.",
        "",
    ]
    return "\n".join(lines)
