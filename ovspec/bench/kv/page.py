"""The KV-layout benchmark's page. ``results_document`` turns a run into a JSON results
document (saved as docs/benchmarks/results/kv.json); ``render`` turns that document, and
nothing else, into the Markdown page, the issue's targets checked against the figures
(met or not, computed, never typed in); ``write_plot`` draws virtual and physical KV
over each arm's own decode time from the run.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.kv.boundaries import (
    COPY,
    DECODE_ARMS,
    MEMCPY,
    PREFAULT,
    REMAP,
    BoundarySample,
    summarize_boundaries,
)
from ovspec.bench.kv.decode import DecodeRun, bands_from_steps, compare_bands, step_passes
from ovspec.bench.kv.targets import targets, targets_table
from ovspec.compile.host import cpu_model
from ovspec.runtime import vmem

MIB = 2**20


def environment() -> dict[str, str]:
    import openvino as ov

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "kernel": f"{platform.system()} {platform.release()}",
        "page_bytes": str(vmem.PAGE_BYTES),
        "transparent_hugepages": thp.read_text().strip() if thp.exists() else "n/a",
        "populate_write": str(vmem.populate_write_supported()),
        "python": platform.python_version(),
        "openvino": ov.get_version(),
    }


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.2f}"


def _ordered(by_arm: Mapping[str, Any]) -> list[str]:
    """Arms in the benchmark's own order (a saved document sorts its keys)."""
    return [arm for arm in DECODE_ARMS if arm in by_arm]


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f}"


def boundary_section(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    lines = [
        "| boundary | live KV MiB | arm | bytes copied | bytes moved | grow ms, median (min–max) "
        "| copy GB/s | peak physical MiB | built ahead ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rate = f"{r['copy_bytes_per_s'] / 1e9:.2f}" if r["copy_bytes_per_s"] else "–"
        prefault = _ms(r["ahead_median_s"]) if r["arm"] in (PREFAULT, REMAP) else "–"
        lines.append(
            f"| {r['from']}→{r['to']} | {r['live_bytes'] / MIB:.1f} | {r['arm']} "
            f"| {r['copied_bytes']:,} | {r['moved_bytes']:,} | {_ms(r['median_s'])} "
            f"({_ms(r['min_s'])}–{_ms(r['max_s'])}) | {rate} | {_mib(r['peak_physical_bytes'])} "
            f"| {prefault} |"
        )
    by = {(r["from"], r["arm"]): r for r in rows}
    starts = sorted({r["from"] for r in rows})
    remap_ms = [1000 * by[(s, REMAP)]["median_s"] for s in starts]
    ratios = [
        by[(s, PREFAULT)]["copy_bytes_per_s"] / by[(s, MEMCPY)]["copy_bytes_per_s"] for s in starts
    ]
    live = [by[(s, REMAP)]["live_bytes"] for s in starts]
    facts = {
        "boundaries": len(starts),
        "live_ratio": max(live) / min(live),
        "remap_copied_bytes": sum(by[(s, REMAP)]["copied_bytes"] for s in starts),
        "remap_max_ms": max(remap_ms),
        "remap_min_ms": min(remap_ms),
        "prefault_vs_memcpy_min": min(ratios),
        "remap_slowest_s": max(by[(s, REMAP)]["max_s"] for s in starts),
        "remap_sample_ranges_s": [
            (by[(s, REMAP)]["min_s"], by[(s, REMAP)]["max_s"]) for s in starts
        ],
        "prefault_vs_memcpy": ratios,
    }
    lines += [
        "",
        f"Remap: {facts['remap_copied_bytes']} bytes copied over {len(starts)} boundaries whose "
        f"live KV differs {facts['live_ratio']:.0f}x; grow {min(remap_ms):.2f}–{max(remap_ms):.2f} "
        "ms (medians). Pre-faulted copy against memcpy into touched pages, same run: "
        + ", ".join(f"{100 * r:.0f}%" for r in ratios)
        + ".",
    ]
    return lines, facts


def memory_section(part2: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    direct_kv = part2["kv_bytes_per_token"] * part2["top_tokens"]
    figures = part2["arms"]
    copy = figures[COPY]
    lines = [
        f"The direct graph's KV (B0, reserved from the start): {direct_kv / MIB:.2f} MiB. "
        "Reserved = the buffers a layout asks for (virtual; what a device allocation would "
        "commit); physical = pages committed, read from /proc/self/pagemap after every step "
        "(present and not shared: the zero page does not count). Time-weighting uses the "
        "run's common clock (at each token the median step time of the arms, boundaries "
        "excluded), so arms differ by what they hold rather than by their step-time noise; "
        "each boundary adds its own interval holding its peak (old and new buffers for "
        "copy-and-grow).",
        "",
        "| arm | reserved token-w MiB | reserved time-w | reserved peak | physical token-w "
        "| physical time-w | physical peak | physical token-w / B0's KV | physical time-w / "
        "copy-and-grow's | physical peak / B0's KV |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in _ordered(figures):
        f = figures[arm]
        token_w = f.get("physical_token_weighted_bytes")
        time_w = f.get("physical_time_weighted_bytes")
        peak = f.get("physical_peak_bytes")
        copy_time = copy.get("physical_time_weighted_bytes")
        lines.append(
            f"| {arm} | {_mib(f['reserved_token_weighted_bytes'])} "
            f"| {_mib(f['reserved_time_weighted_bytes'])} | {_mib(f['reserved_peak_bytes'])} "
            f"| {_mib(token_w)} | {_mib(time_w)} | {_mib(peak)} "
            + (f"| {token_w / direct_kv:.3f} | " if token_w is not None else "| n/a | ")
            + (f"{time_w / copy_time:.3f}" if time_w and copy_time else "n/a")
            + f" | {(peak or 0) / direct_kv:.3f} |"
        )
    return lines, {"direct_kv_bytes": direct_kv, "arms": figures}


def decode_boundaries_section(part2: Mapping[str, Any]) -> list[str]:
    lines = [
        "| arm | boundary | live tokens | migration ms | bytes copied | bytes moved "
        "| peak physical MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for arm in _ordered(part2["boundaries"]):
        for b in part2["boundaries"][arm]:
            lines.append(
                f"| {arm} | {b['from']}→{b['to']} | {b['at_live_tokens']} "
                f"| {_ms(b['migration_s'])} | {b['copied_bytes']:,} | {b['moved_bytes']:,} "
                f"| {_mib(b['peak_physical_bytes'])} |"
            )
    quiet = part2.get("speed_pass_migration_s", {})
    if quiet:
        lines += [
            "",
            "In this first pass the loader compiles each successor in the background, beside "
            "the boundaries. The speed passes load every graph before a rung's first step, "
            "so nothing runs beside their boundaries; migration ms there, per arm over "
            f"{sum(len(v) for v in quiet.get(REMAP, []))} boundaries: "
            + "; ".join(
                f"{arm} median {_ms(float(np.median(flat)))} (min–max "
                f"{_ms(min(flat))}–{_ms(max(flat))})"
                for arm in _ordered(quiet)
                if (flat := [x for one_pass in quiet[arm] for x in one_pass])
            )
            + ".",
        ]
    return lines


def speed_section(part2: Mapping[str, Any]) -> list[str]:
    passes = part2.get("passes", 1)
    pooled = (
        f" Remap's rows pool {passes} passes: the first, with every arm, and {passes - 1} "
        f"of copy-and-grow against remap alone, with each rung's successor loaded before the "
        "rung's first timed step (the first pass loads it in the background, as a decode "
        "would); *steps* counts the pooled pairs."
        if passes > 1
        else ""
    )
    lines = [
        "Mean decode step (inference only) per context band; the change is the arm's mean "
        "step against copy-and-grow's at the same tokens, with a paired-t 95% CI over the "
        f"band's tokens (positive: slower).{pooled}",
        "",
        "| arm | band | steps | copy-and-grow ms | arm ms | tokens/s copy-and-grow | "
        "tokens/s arm | change | 95% CI | arm faster |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for arm in _ordered(part2["bands"]):
        for r in part2["bands"][arm]:
            lines.append(
                f"| {arm} | {r['band']} | {r['steps']} | {r['copy_step_ms']:.2f} "
                f"| {r['arm_step_ms']:.2f} | {1000 / r['copy_step_ms']:.2f} "
                f"| {1000 / r['arm_step_ms']:.2f} | {100 * r['relative_change']:+.2f}% "
                f"| [{100 * r['ci_low']:+.2f}%, {100 * r['ci_high']:+.2f}%] "
                f"| {r['arm_faster_steps']}/{r['steps']} |"
            )
    return lines


def agreement_section(part2: Mapping[str, Any]) -> list[str]:
    lines = [
        "| arm vs copy-and-grow | steps | top-1 equal | min cosine | steps near a boundary "
        "| top-1 equal | min cosine |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in _ordered(part2["agreement"]):
        a = part2["agreement"][arm]
        lines.append(
            f"| {arm} | {a['steps']} | {a['top1_equal']} | {a['min_cosine']:.9f} "
            f"| {a['boundary_steps']} | {a['boundary_top1_equal']} "
            f"| {a['boundary_min_cosine']:.9f} |"
        )
    return lines


# History: 1 — medians and ranges only (2026-11); 2 — part 1's samples and part 2's
# steps kept, the page recomputes its rows and bands from them (2026-12).
RESULTS_FORMAT = 2


def results_document(
    command: str,
    env: Mapping[str, str],
    loads: tuple[str, str],
    model: str,
    samples: Sequence[BoundarySample],
    boundary_ladder: str,
    repetitions: int,
    run: DecodeRun,
    plot_name: str,
    wall_s: float,
) -> dict[str, Any]:
    """Everything the page shows, as plain JSON (``render`` reads nothing else)."""
    cfg = run.config
    document = {
        "format": RESULTS_FORMAT,
        "command": command,
        "environment": dict(env),
        "load_average": {"start": loads[0], "end": loads[1]},
        "model": model,
        "wall_s": wall_s,
        "plot": plot_name,
        "part1": {
            "ladder": boundary_ladder,
            "repetitions": repetitions,
            "rows": summarize_boundaries(samples),
            "samples": [asdict(sample) for sample in samples],
        },
        "part2": {
            "ladder": str(cfg.ladder),
            "top_tokens": cfg.ladder.top_tokens,
            "prompt_tokens": cfg.prompt_tokens,
            "prefault_lead_tokens": cfg.prefault_lead_tokens,
            "passes": cfg.passes,
            "kv_bytes_per_token": run.kv_bytes_per_token,
            "weights_bytes": run.weights_bytes,
            "arms": {arm: t.figures(run.clock) for arm, t in run.traces.items()},
            "boundaries": {arm: t.boundaries for arm, t in run.traces.items()},
            "bands": {
                arm: [vars(r) for r in compare_bands(run, arm)] for arm in run.traces if arm != COPY
            },
            "steps": step_passes(run),
            "agreement": run.agreement,
            "speed_pass_migration_s": {
                arm: [
                    [b["migration_s"] for b in traces[arm].boundaries]
                    for traces in run.speed_traces
                ]
                for arm in (COPY, REMAP)
                if run.speed_traces
            },
        },
    }
    safe: dict[str, Any] = json_safe(document)
    return safe


def _recomputed(results: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Part 1's rows and part 2 with its bands, recomputed from the samples and steps
    when the document kept them (format 2), else as format 1 saved them."""
    samples = results["part1"].get("samples")
    rows = (
        summarize_boundaries([BoundarySample(**s) for s in samples])
        if samples is not None
        else list(results["part1"]["rows"])
    )
    part2 = dict(results["part2"])
    if "steps" in part2:
        ladder = [int(c) for c in str(part2["ladder"]).split(",")]
        part2["bands"] = {
            arm: [vars(r) for r in bands_from_steps(part2["steps"], ladder, arm)]
            for arm in part2["steps"][0]
            if arm != COPY
        }
    return rows, part2


def render(results: Mapping[str, Any]) -> str:
    """The Markdown page of a results document."""
    part1, env = results["part1"], results["environment"]
    samples = part1.get("samples")
    rows, part2 = _recomputed(results)
    b_lines, b_facts = boundary_section(rows)
    m_lines, m_facts = memory_section(part2)
    checks = targets(b_facts, m_facts, part2, samples)
    kv_bytes, top = part2["kv_bytes_per_token"], part2["top_tokens"]
    loads = results["load_average"]
    lines = [
        "# KV layouts: remap against copy-and-grow (issue 12)",
        "",
        "Generated by `tools/bench_kv.py`; every figure below comes from the one run whose",
        "command is given. Nothing here is typed in by hand: the targets table is computed.",
        "",
        *(f"- {name}: {v.bold()} ({value})." for name, value, v in checks),
        "",
        "```sh",
        results["command"],
        "```",
        "",
        f"- model `{results['model']}`; KV {kv_bytes:,} bytes/token "
        f"({kv_bytes * top / MIB:.1f} MiB at the decode ladder's top); weights "
        f"{part2['weights_bytes'] / MIB:.0f} MiB",
        f"- {env['cpu']}, {env['cores']} cores; {env['kernel']}; page {env['page_bytes']} "
        f"bytes; THP `{env['transparent_hugepages']}`; MADV_POPULATE_WRITE "
        f"{'yes' if env['populate_write'] == 'True' else 'no (memset)'}; Python "
        f"{env['python']}; OpenVINO {env['openvino']}",
        f"- load average (1/5/15 min) at the start {loads['start']}, at the end "
        f"{loads['end']}; wall {results['wall_s'] / 60:.1f} min",
        "",
        "## Reading this page",
        "",
        "- On a CPU every layout's KV is committed lazily: ovspec's buffers are anonymous "
        "mappings, so a page costs memory only once written, and the attention's reads of "
        "empty slots map the kernel's zero page. The direct graph's and copy-and-grow's "
        "*physical* KV therefore follow the tokens too; their *reserved* columns are what a "
        "device allocation would commit. What remap changes on a CPU is the boundary: nothing "
        "is copied, and old and new buffers never coexist (the physical peak).",
        "- Part 1 repeats each boundary and reports medians; the decode run (part 2) has one "
        "sample per boundary, taken while OpenVINO's threads share the process, so its "
        "boundary times show preemption and TLB-shootdown outliers that the medians hide.",
        "- Timings depend on the machine's load (given above); the lead reruns final figures "
        "on a quiet machine with the command at the top.",
        "",
        "## 1. One boundary: bytes copied and time",
        "",
        f"A cache shaped like the model's KV grows across ladder {part1['ladder']}; every "
        "slot of the old rung is written first, as at a real boundary. Each arm runs "
        f"{part1['repetitions']} times per boundary, the arms in rotated order. *grow* is the "
        "whole `grow()` call (allocate, copy or move, free); *copy GB/s* is the bytes "
        "copied over the allocation (or the wait for the pre-fault) plus the copy, without "
        "the free. Work done before the boundary is shown apart (*built ahead*): the "
        "pre-fault arm's thread, finished before the boundary as with an ample lead, and "
        "remap's plan of the growth (its page moves, views and tensors), which a decode "
        "builds at its first write on a rung. *memcpy*: a flat copy of the same bytes into "
        "committed pages.",
        "",
        *b_lines,
        "",
        "## 2. KV memory over a decode run",
        "",
        f"The arms decode the same {part2['prompt_tokens']}-token prompt and "
        f"{top - part2['prompt_tokens']} teacher-forced tokens over ladder "
        f"{part2['ladder']} (direct: one graph at {top}) in lockstep: at each "
        "token every arm takes its step, in a Williams order over the arms; the pre-fault "
        f"lead is {part2['prefault_lead_tokens']} tokens. The plot's x axis is each arm's own "
        "decode time.",
        "",
        *m_lines,
        "",
        f"![virtual and physical KV over time]({results['plot']})",
        "",
        "Boundaries in this run:",
        "",
        *decode_boundaries_section(part2),
        "",
        "## 3. Decode speed per band",
        "",
        *speed_section(part2),
        "",
        "## 4. Logits",
        "",
        "Every arm's logits against copy-and-grow's at every step (the same compiled graphs "
        "and inputs); *near a boundary*: live tokens from one before to two after a rung's "
        "capacity.",
        "",
        *agreement_section(part2),
        "",
        "## Targets (issue 12, 'done when')",
        "",
        *targets_table(checks),
        "",
    ]
    return "\n".join(lines)


def write_plot(run: DecodeRun, path: Path) -> Path:
    from ovspec.bench.common import plots

    runs = {}
    for arm, trace in run.traces.items():
        runs[arm] = {
            "kv_samples": [list(s) for s in trace.samples],
            "boundaries": [
                {"at_live_tokens": b["at_live_tokens"], "began_s": b["began_s"]}
                for b in trace.boundaries
            ],
            "migrations": [
                {
                    "at_live_tokens": b["at_live_tokens"],
                    "peak_physical_bytes": b["peak_physical_bytes"],
                }
                for b in trace.boundaries
            ],
        }
    return plots.kv_over_time(
        runs, path, "KV over each arm's own decode time (lockstep run)", x_label="seconds of decode"
    )


def json_safe(value: Any) -> Any:
    """Numbers numpy left behind, as plain JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
