"""The generality sweep's page (docs/benchmarks/sweep.md), rendered from its results
document alone: per cell I2 against I1 (foreground and critical-path savings with their
CI, waits, deadlines, KV ratios; the plan's explanation where one-ahead does not pay),
then auto against the fixed policies (``autopage``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ovspec.bench.protocols.metrics import RunFigures, median
from ovspec.bench.sweep.autopage import auto_section
from ovspec.errors import TrialError
from ovspec.ladder import Ladder
from ovspec.runtime.plan import RungCosts, plan_one_ahead
from ovspec.stats.paired import PairedSummary, summarize_pairs

MIB = 2**20


@dataclass(frozen=True)
class CellVerdict:
    label: str
    fg_saving_s: float
    fg_saving_rel: float
    cp: PairedSummary | None
    waits_s: float
    met: int
    total: int
    kv_ratio: float  # I2 / I1, reserved KV open to last token
    kv_decode_ratio: float  # I2 / I1, reserved KV over the decode's time
    pays: bool
    why: str


def _figures(cell: Mapping[str, Any], protocol: str) -> dict[int, RunFigures]:
    runs = [RunFigures.from_json(r) for r in cell["runs"]]
    return {r.repetition: r for r in runs if r.protocol == protocol}


def _plan_explanation(cell: Mapping[str, Any], i1: RunFigures, prompt: int) -> str:
    ladder = Ladder(tuple(cell["ladder"]))
    decode = {b.high_tokens: b.infer_s / b.steps for b in i1.bands if b.steps}
    compile_s = {
        int(k.split("@")[1]): v for k, v in i1.ready_cost_s.items() if k.startswith("decode@")
    }
    prefill = [v for k, v in i1.ready_cost_s.items() if k.startswith("prefill@")]
    try:
        plan = plan_one_ahead(
            ladder,
            prompt,
            ladder.top_tokens - prompt,
            RungCosts(compile_s, decode, prefill[0] if prefill else 0.0, i1.prefill_s),
        )
    except Exception as exc:  # a control run without a cost the plan needs
        return f"no plan ({exc})"
    stalls = plan.stalls
    saved = i1.foreground_s - plan.foreground_s
    if stalls:
        worst = min(stalls, key=lambda b: b.slack_s)
        return (
            f"the plan predicts {len(stalls)} stall(s) of {plan.wait_s:.2f} s in all: at "
            f"{worst.label} the build takes {worst.compile_s:.2f} s against a "
            f"{worst.window_s:.2f} s window ({worst.window_tokens} tokens)"
        )
    return (
        f"the plan predicts no stall (smallest slack "
        f"{min((b.slack_s for b in plan.boundaries), default=0.0):+.2f} s) and "
        f"{saved:.2f} s of foreground saved; the saving is lost to the decode slowing "
        "while successors build beside it and to the import on each boundary"
    )


def verdict(cell: Mapping[str, Any], prompt: int) -> CellVerdict:
    i1, i2 = _figures(cell, "I1"), _figures(cell, "I2")
    common = sorted(set(i1) & set(i2))
    fg_a = [i1[k].foreground_s for k in common]
    fg_b = [i2[k].foreground_s for k in common]
    cp: PairedSummary | None
    try:
        cp = summarize_pairs(
            [i1[k].critical_path_s for k in common], [i2[k].critical_path_s for k in common]
        )
    except TrialError:
        cp = None
    fg_saving = median([a - b for a, b in zip(fg_a, fg_b, strict=True)])
    met = sum(i2[k].deadlines_met[0] for k in common)
    total = sum(i2[k].deadlines_met[1] for k in common)
    kv = median(
        [
            i2[k].reserved_kv_open_to_last_bytes / i1[k].reserved_kv_open_to_last_bytes
            for k in common
            if i1[k].reserved_kv_open_to_last_bytes > 0
        ]
    )
    kv_decode = median(
        [
            i2[k].reserved_kv_time_weighted_bytes / i1[k].reserved_kv_time_weighted_bytes
            for k in common
            if i1[k].reserved_kv_time_weighted_bytes > 0
        ]
    )
    pays = cp is not None and cp.t_test.ci_high < 0
    why = "" if pays or not common else _plan_explanation(cell, i1[common[0]], prompt)
    if not pays and cp is not None and cp.mean_diff < 0:
        why = "shorter on average but the 95% CI includes 0; " + why
    return CellVerdict(
        label=f"{cell['preset']} / {cell['ladder_name']} / {cell['compression']}",
        fg_saving_s=fg_saving,
        fg_saving_rel=fg_saving / median(fg_a) if fg_a and median(fg_a) > 0 else 0.0,
        cp=cp,
        waits_s=sum(i2[k].boundary_wait_s for k in common),
        met=met,
        total=total,
        kv_ratio=kv,
        kv_decode_ratio=kv_decode,
        pays=pays,
        why=why,
    )


def _tally(verdicts: Sequence[CellVerdict]) -> str:
    slower = sum(_pays_text(v) == "**no**" for v in verdicts)
    return (
        f"One-ahead pays in {sum(v.pays for v in verdicts)} of {len(verdicts)} cells (the "
        f"critical path's saving has its whole 95% interval above 0); {slower} are shown "
        "slower under it; the rest are not established either way."
    )


def _pays_text(v: CellVerdict) -> str:
    """yes: the whole interval of the saving is above 0; no: the whole interval is below
    0 (one-ahead is slower); otherwise not established."""
    if v.pays:
        return "yes"
    if v.cp is not None and v.cp.t_test.ci_low > 0:
        return "**no**"
    return "not established"


def _cp_text(cp: PairedSummary | None) -> str:
    if cp is None:
        return "n/a"
    return (
        f"{-cp.mean_diff:+.3f} s ({-100 * cp.relative_change:+.1f}%) "
        f"[{-cp.t_test.ci_high:+.3f}, {-cp.t_test.ci_low:+.3f}]"
    )


def _precisions(cells: list[Mapping[str, Any]]) -> str:
    used = sorted({c["compression"] for c in cells}, key=lambda c: (c != "none", c != "int8", c))
    if used == ["none", "int8", "int4"]:
        return "f16 weights (none), nncf int8 and int4 weight compression"
    return ", ".join(used) + " (none: the model's own weights; intN: nncf weight compression)"


def render(document: Mapping[str, Any]) -> str:
    prompt = int(document["prompt_tokens"])
    verdicts = [verdict(c, prompt) for c in document["cells"]]
    arms = list(document.get("protocols", ["I1", "I2"]))
    title, compared = (
        "One-ahead across model sizes, ladders and precisions (issue 11)",
        ("I1 (every rung built up front) against I2 (one ahead)"),
    )
    if "auto" in arms:
        title = "One-ahead and auto across model sizes, ladders and precisions"
        compared = (
            f"{', '.join(arms)} (B0 one top-rung graph, I1 every rung built up front, I2 one "
            "ahead, auto the planning policy with its costs from an untimed "
            f"{document.get('calibration_protocol', 'I1')} calibration run per cell)"
        )
    split = document["split"]
    cores = (
        f"device cores {split['device']}, host cores {split['host']}"
        if split
        else "shared cores (no split)"
    )
    before = ", ".join(f"{x:.2f}" for x in document["load_before"])
    after = ", ".join(f"{x:.2f}" for x in document["load_after"])
    ladders = {c["ladder_name"]: c["ladder"] for c in document["cells"]}
    lines = [
        f"# {title}",
        "",
        "Generated by `python tools/sweep.py` from `docs/benchmarks/results/sweep.json`; do "
        "not edit by hand.",
        "",
        f"- {_tally(verdicts)}",
        "",
        "```sh",
        str(document.get("command", "python tools/sweep.py")),
        "```",
        "",
        f"- {compared}, N = "
        f"{document['repetitions']} pairs per cell in rotated (Williams) order, a fresh process "
        f"and a cold store per run, a {prompt}-token prompt then teacher-forced tokens to the top "
        f"rung; {cores}; load mode import; properties "
        + ", ".join(f"`{k}={v}`" for k, v in sorted(document["properties"].items()))
        + ".",
        "- Ladders: "
        + "; ".join(f"{name} {','.join(map(str, lad))}" for name, lad in ladders.items())
        + f". Precisions: {_precisions(document['cells'])}.",
        f"- Load average (1, 5, 15 min) {before} before and {after} after; wall "
        f"{document['wall_s'] / 60:.1f} min.",
        "",
        "| cell (model / ladder / precision) | fg saving s | critical-path saving s (%) "
        "[95% CI] | waits s | deadlines | KV open→last I2/I1 | KV decode-time I2/I1 | "
        "pays |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        lines.append(
            f"| {v.label} | {v.fg_saving_s:+.3f} ({100 * v.fg_saving_rel:+.0f}%) | "
            f"{_cp_text(v.cp)} | {v.waits_s:.3f} | {v.met}/{v.total} | {v.kv_ratio:.3f} | "
            f"{v.kv_decode_ratio:.3f} | {_pays_text(v)} |"
        )
    lines += [
        "",
        "Savings are I1 − I2 (positive: one-ahead is faster); the critical-path interval is "
        "the paired-t 95% CI. Waits: boundary waits summed over I2's runs; deadlines: "
        "successors ready before their boundary. KV: I2's reserved KV over I1's, averaged "
        "from open to last token and over the decode's time (medians of paired ratios).",
        "",
        "## Where one-ahead is not shown to pay",
        "",
    ]
    losers = [v for v in verdicts if not v.pays]
    if not losers:
        lines.append("Every cell's critical path is shorter under one-ahead, CI excluding 0.")
    for v in losers:
        lines.append(f"- **{v.label}**: {v.why}")
    lines += [
        "",
        f"{_tally(verdicts)} The plan's "
        "explanation comes from `plan_one_ahead` fed with the first I1 run of the cell (each "
        "rung's build + import and decode time per token, measured while nothing else ran).",
        *auto_section(document["cells"]),
    ]
    return "\n".join(lines) + "\n"
