"""Turning a ``BenchResult`` into a text report, a JSON document and PNG plots.

Medians over repetitions per protocol, paired differences against the I1 control
(with the exact sign-flip p and its floor), per-band speed-ups next to what bytes
moved predict, migrations next to memcpy bandwidth, and boundary agreement.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ovspec.bench.protocols.metrics import median
from ovspec.bench.protocols.runner import (
    PAIRED_FIGURES,
    BenchResult,
    RunOutcome,
    band_comparison,
    boundary_agreement,
    medians,
    paired_vs_control,
)
from ovspec.bench.protocols.setups import CONTROL, SETUPS, Protocol
from ovspec.compile.host import cpu_model
from ovspec.stats.paired import PairedSummary

MIB = 2**20


def environment() -> dict[str, str]:
    import openvino as ov

    cpu = cpu_model()
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "openvino": ov.get_version(),
    }


def _paired_text(summary: PairedSummary | str) -> str:
    if isinstance(summary, str):
        return summary
    s = summary
    flip = s.sign_flip
    return (
        f"{s.mean_diff:+.3f} s ({100 * s.relative_change:+.1f}%), 95% CI "
        f"[{s.t_test.ci_low:+.3f}, {s.t_test.ci_high:+.3f}], faster in {s.b_faster_pairs}/"
        f"{s.n_pairs}, sign-flip p={flip.p_value:.4g} (min possible {flip.min_attainable_p:.4g})"
    )


def render_text(result: BenchResult, env: dict[str, str]) -> list[str]:
    cfg = result.config
    sample = result.runs[0].figures if result.runs else None
    lines = [
        f"ovspec bench: {cfg.model.root}",
        f"  ladder {cfg.ladder}; prompt {cfg.prompt_tokens} + {cfg.new_tokens} forced tokens; "
        f"device {cfg.device}; {cfg.repetitions} repetition(s) in Williams order; seed {cfg.seed}",
        f"  {env['cpu']}, {env['cores']} cores; OpenVINO {env['openvino']}; "
        f"memcpy {result.memcpy_bytes_per_s / 1e9:.2f} GB/s; wall {result.wall_s:.1f} s",
        "  floor (measured): the stateful model's step "
        + (
            ", ".join(f"{ms:.2f} ms at {n}" for n, ms in sorted(result.floor_step_ms.items()))
            or "n/a (a stateless IR)"
        )
        + f" live tokens; a weights-only read {result.weights_read_ms:.2f} ms",
    ]
    if sample is not None:
        lines.append(
            f"  weights {sample.weights_bytes / MIB:.1f} MiB; KV {sample.kv_bytes_per_token} "
            f"bytes/token ({sample.kv_bytes_per_token * cfg.ladder.top_tokens / MIB:.1f} MiB "
            "at the top rung)"
        )
    for protocol in cfg.protocols:
        lines.append(f"  {protocol.value}: {SETUPS[protocol].description}")
    for variant, split in ((label, split) for label, _, split in cfg.arms):
        cores = split.describe() if split is not None else "shared cores (no split)"
        lines += ["", f"== {variant} store, {cores} ==", *_variant_text(result, variant)]
    return lines


def _variant_text(result: BenchResult, variant: str) -> list[str]:
    return [
        *_summary_table(result, variant),
        "",
        *_kv_memory_text(result, variant),
        "",
        *_paired_text_lines(result, variant),
        "",
        *_boundaries_text(result, variant),
        "",
        *_bands_text(result, variant),
        "",
        *_agreement_text(result, variant),
    ]


def _summary_table(result: BenchResult, variant: str) -> list[str]:
    """Medians per protocol, then what I2's foreground and copy-and-grow's KV come to."""
    cfg = result.config
    lines = [
        f"{'':4}{'fg compile s':>13}{'TTFT s':>9}{'critical s':>11}{'decode s':>10}"
        f"{'wait s':>9}{'deadlines':>10}{'KV avg MiB':>11}{'KV peak MiB':>12}{'RSS MiB':>9}"
    ]
    for protocol in cfg.protocols:
        runs = result.select(variant, protocol)
        if not runs:
            continue
        met = sum(r.figures.deadlines_met[0] for r in runs)
        total = sum(r.figures.deadlines_met[1] for r in runs)
        lines.append(
            f"{protocol.value:<4}{medians(runs, 'foreground_s'):>13.3f}"
            f"{medians(runs, 'time_to_first_token_s'):>9.3f}"
            f"{medians(runs, 'critical_path_s'):>11.3f}{medians(runs, 'decode_s'):>10.3f}"
            f"{median([r.figures.boundary_wait_s for r in runs]):>9.3f}"
            f"{(f'{met}/{total}' if total else '-'):>10}"
            f"{medians(runs, 'reserved_kv_time_weighted_bytes') / MIB:>11.2f}"
            f"{medians(runs, 'peak_kv_bytes') / MIB:>12.2f}"
            f"{medians(runs, 'peak_rss_bytes') / MIB:>9.0f}"
        )
    lines.append("(medians over repetitions; wait = total boundary wait per run)")
    i2 = result.select(variant, Protocol.I2)
    if i2:
        fg = medians(i2, "foreground_s")
        first = medians(i2, "first_rung_compile_s")
        lines.append(
            f"I2 foreground {fg:.3f} s = {fg / first:.2f} x the compile + import of its first "
            f"rung's graphs, summed ({first:.3f} s): they load side by side, and reading and "
            "preparing the model adds to the wall"
            if first > 0
            else f"I2 foreground {fg:.3f} s (no compile: every graph came from the store)"
        )
    b0 = result.select(variant, Protocol.B0)
    i1 = result.select(variant, Protocol.I1)
    if b0 and i1:
        ratio = medians(i1, "reserved_kv_time_weighted_bytes") / medians(
            b0, "reserved_kv_time_weighted_bytes"
        )
        lines.append(
            f"copy-and-grow time-weighted KV = {ratio:.3f} x B0's; peak "
            f"{medians(i1, 'peak_kv_bytes') / MIB:.2f} MiB (at the last migration) vs B0's "
            f"{medians(b0, 'peak_kv_bytes') / MIB:.2f} MiB"
        )
    return lines


def _paired_text_lines(result: BenchResult, variant: str) -> list[str]:
    cfg = result.config
    lines = [f"paired vs {CONTROL.value} (A = {CONTROL.value}, B = protocol, B - A):"]
    if cfg.repetitions < 2:
        lines.append(
            f"  none: paired statistics need at least 2 repetitions (this run made "
            f"{cfg.repetitions}); rerun with --repetitions 2 or more"
        )
    for protocol in cfg.protocols if cfg.repetitions >= 2 else ():
        if protocol is CONTROL:
            continue
        for figure in PAIRED_FIGURES:
            summary = paired_vs_control(result, variant, protocol, figure)
            lines.append(f"  {protocol.value} {figure:<16} {_paired_text(summary)}")
    return lines


def _boundaries_text(result: BenchResult, variant: str) -> list[str]:
    lines = ["boundaries (median over repetitions):"]
    for protocol in result.config.protocols:
        runs = result.select(variant, protocol)
        if not runs or not runs[0].figures.boundaries:
            continue
        for index, b in enumerate(runs[0].figures.boundaries):
            same = [r.figures.boundaries[index] for r in runs if len(r.figures.boundaries) > index]
            mig_s = median([x.migration_s for x in same])
            bw = median([x.migration_bytes_per_s for x in same])
            if b.copied_bytes:
                how = f" at {bw / 1e9:.2f} GB/s (memcpy {result.memcpy_bytes_per_s / 1e9:.2f} GB/s)"
            elif b.moved_bytes:
                how = f" ({b.moved_bytes / MIB:.2f} MiB of pages moved, no copy)"
            else:
                how = " (no copy)"
            lines.append(
                f"  {protocol.value} {b.from_capacity_tokens}->{b.to_capacity_tokens}: wait "
                f"{median([x.wait_s for x in same]):.4f} s; migration {1000 * mig_s:.2f} ms, "
                f"{b.copied_bytes / MIB:.2f} MiB copied{how}"
            )
    return lines


def _bands_text(result: BenchResult, variant: str) -> list[str]:
    """Tokens/s per band, then each protocol's speed-up over B0 against the prediction."""
    cfg = result.config
    lines = ["decode tokens/s per context band (median over repetitions):"]
    bands = [b.band for b in result.runs[0].figures.bands] if result.runs else []
    lines.append(f"{'':4}" + "".join(f"{band:>14}" for band in bands))
    for protocol in cfg.protocols:
        runs = result.select(variant, protocol)
        if runs:
            rates = [
                median([r.figures.bands[i].tokens_per_s for r in runs]) for i in range(len(bands))
            ]
            lines.append(f"{protocol.value:<4}" + "".join(f"{v:>14.1f}" for v in rates))
    for protocol in (p for p in cfg.protocols if p is not Protocol.B0):
        rows = band_comparison(result, variant, protocol)
        if not rows:
            continue
        lines.append(
            f"speed-up of {protocol.value} over B0 per band, measured vs bytes-moved model:"
        )
        for row in rows:
            lines.append(
                f"  {row.band:>12}: step {row.step_ms:.3f} ms (B0 {row.b0_step_ms:.3f} ms, "
                f"stateful {row.floor_step_ms:.3f} ms: {row.step_ms / row.floor_step_ms:.2f}x); "
                f"speed-up {row.measured_speedup:.3f} vs predicted "
                f"{row.predicted_speedup:.3f}"
                + _gain_text(row.predicted_speedup, row.fraction_of_predicted)
            )
    return lines


def _agreement_text(result: BenchResult, variant: str) -> list[str]:
    lines = [f"boundary logits vs {CONTROL.value} (same positions, same tokens):"]
    for protocol in result.config.protocols:
        if protocol is CONTROL:
            continue
        agreement = boundary_agreement(result, variant, protocol)
        lines.append(
            f"  {protocol.value}: top-1 equal {agreement.top1_equal}/{agreement.compared}, "
            f"min cosine {agreement.min_cosine:.7f}"
        )
    return lines


def _gain_text(predicted_speedup: float, fraction_of_predicted: float) -> str:
    """How much of a predicted gain was measured; nothing for a noise-level prediction,
    and no percentage of a gain that did not happen."""
    if predicted_speedup <= 1.05:
        return ""
    if fraction_of_predicted < 0:
        return " (slower than B0, where a gain was predicted)"
    return f" ({100 * fraction_of_predicted:.0f}% of the predicted gain)"


def _mib(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value / MIB:.2f}"  # NaN: n/a


def _optional_median(runs: Sequence[RunOutcome], name: str) -> float | None:
    values = [getattr(r.figures, name) for r in runs]
    known = [float(v) for v in values if v is not None]
    return median(known) if known else None


def _kv_memory_text(result: BenchResult, variant: str) -> list[str]:
    """Reserved (virtual) and physical (committed, pagemap) KV per protocol, averaged
    over the decode's wall time and over its tokens, with peaks; ratios to B0's KV."""
    cfg = result.config
    lines = [
        "KV memory, MiB (median over repetitions; physical = pages committed, measured):",
        f"{'':4}{'layout':>15}{'res time-w':>11}{'res token-w':>12}{'phys time-w':>12}"
        f"{'phys token-w':>13}{'res peak':>10}{'phys peak':>10}",
    ]
    b0_kv = None
    for protocol in cfg.protocols:
        runs = result.select(variant, protocol)
        if not runs:
            continue
        if protocol is Protocol.B0:
            b0_kv = float(runs[0].figures.kv_bytes_per_token * cfg.ladder.top_tokens)
        lines.append(
            f"{protocol.value:<4}{runs[0].figures.kv_layout or '-':>15}"
            f"{_mib(medians(runs, 'reserved_kv_time_weighted_bytes')):>11}"
            f"{_mib(medians(runs, 'reserved_kv_token_weighted_bytes')):>12}"
            f"{_mib(_optional_median(runs, 'physical_kv_time_weighted_bytes')):>12}"
            f"{_mib(_optional_median(runs, 'physical_kv_token_weighted_bytes')):>13}"
            f"{_mib(medians(runs, 'peak_kv_bytes')):>10}"
            f"{_mib(_optional_median(runs, 'peak_physical_kv_bytes')):>10}"
        )
    if b0_kv:
        for protocol in (p for p in cfg.protocols if p is not Protocol.B0):
            runs = result.select(variant, protocol)
            token_w = _optional_median(runs, "physical_kv_token_weighted_bytes")
            peak = _optional_median(runs, "peak_physical_kv_bytes")
            if runs and token_w is not None and peak is not None:
                lines.append(
                    f"  {protocol.value}: physical token-weighted {token_w / b0_kv:.3f} x B0's KV "
                    f"({b0_kv / MIB:.2f} MiB reserved from the start), peak {peak / b0_kv:.3f} x"
                )
    notes = {r.timeline.get("kv_note", "") for r in result.runs if r.figures.variant == variant}
    lines += [f"  note: {note}" for note in sorted(notes) if note]
    return lines


def to_json(result: BenchResult, env: dict[str, str]) -> dict[str, Any]:
    cfg = result.config
    document: dict[str, Any] = {
        "environment": env,
        "config": {
            "model": str(cfg.model.root),
            "ladder": list(cfg.ladder),
            "prompt_tokens": cfg.prompt_tokens,
            "new_tokens": cfg.new_tokens,
            "repetitions": cfg.repetitions,
            "variants": list(cfg.variants),
            "device": cfg.device,
            "properties": cfg.properties,
            "prefill_chunk_tokens": cfg.prefill_chunk_tokens,
            "seed": cfg.seed,
            "protocols": [p.value for p in cfg.protocols],
            "split": cfg.split.to_json() if cfg.split is not None else None,
            "shared_too": cfg.shared_too,
            "load_mode": cfg.load_mode,
            "compression": cfg.compression,
            "arms": cfg.labels,
        },
        "memcpy_bytes_per_s": result.memcpy_bytes_per_s,
        "floor_step_ms": {str(n): ms for n, ms in sorted(result.floor_step_ms.items())},
        "weights_read_ms": result.weights_read_ms,
        "wall_s": result.wall_s,
        "runs": [r.figures.to_json() for r in result.runs],
        "variants": {},
    }
    for variant in cfg.labels:
        per_protocol = {}
        for protocol in cfg.protocols:
            runs = result.select(variant, protocol)
            if not runs:
                continue
            paired = {}
            if protocol is not CONTROL:
                for figure in PAIRED_FIGURES:
                    summary = paired_vs_control(result, variant, protocol, figure)
                    paired[figure] = summary if isinstance(summary, str) else summary.to_dict()
                agreement = boundary_agreement(result, variant, protocol)
                paired["boundary_agreement"] = {
                    "compared": agreement.compared,
                    "top1_equal": agreement.top1_equal,
                    "min_cosine": agreement.min_cosine,
                }
            per_protocol[protocol.value] = {
                "median": {
                    name: medians(runs, name)
                    for name in (
                        "foreground_s",
                        "time_to_first_token_s",
                        "critical_path_s",
                        "decode_s",
                        "first_rung_compile_s",
                        "reserved_kv_time_weighted_bytes",
                        "reserved_kv_token_weighted_bytes",
                        "peak_kv_bytes",
                        "peak_rss_bytes",
                    )
                },
                "physical_median": {
                    name: _optional_median(runs, name)
                    for name in (
                        "physical_kv_time_weighted_bytes",
                        "physical_kv_token_weighted_bytes",
                        "peak_physical_kv_bytes",
                    )
                },
                "kv_layout": runs[0].figures.kv_layout,
                "vs_control": paired,
                "bands_vs_b0": [
                    {
                        "band": row.band,
                        "step_ms": row.step_ms,
                        "b0_step_ms": row.b0_step_ms,
                        "floor_step_ms": row.floor_step_ms,
                        "measured_speedup": row.measured_speedup,
                        "predicted_speedup": row.predicted_speedup,
                    }
                    for row in band_comparison(result, variant, protocol)
                ],
            }
        document["variants"][variant] = per_protocol
    return document


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    from ovspec.bench.common import plots

    written = []
    for variant in result.config.labels:
        chosen = {}
        for protocol in result.config.protocols:
            runs = result.select(variant, protocol)
            if runs:
                first = runs[0]
                chosen[protocol.value] = {
                    **first.timeline,
                    "migrations": [
                        {
                            "at_live_tokens": b.at_live_tokens,
                            "peak_reserved_bytes": b.peak_reserved_bytes,
                            "allocated_bytes": b.allocated_bytes,
                            "copied_bytes": b.copied_bytes,
                            "peak_physical_bytes": b.peak_physical_bytes,
                        }
                        for b in first.figures.boundaries
                    ],
                }
        if not chosen:
            continue
        written.append(
            plots.timeline(
                chosen,
                out_dir / f"timeline-{variant}.png",
                f"decode and compile lanes, {variant} store, repetition 0",
            )
        )
        written.append(
            plots.kv_over_tokens(
                chosen, out_dir / f"kv-{variant}.png", f"reserved KV over tokens, {variant} store"
            )
        )
        written.append(
            plots.kv_over_time(
                chosen,
                out_dir / f"kv-time-{variant}.png",
                f"virtual (reserved) and physical (committed) KV over time, {variant} store",
            )
        )
    return written
