"""The KV page's targets (issue 12's "done when"), each with its verdict: counts and
bytes by their value, timings by every sample or by a 95% interval, never by a median or
a single run alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.bench.common.verdicts import Interval, Verdict, combined, within
from ovspec.bench.kv.boundaries import COPY, MEMCPY, PREFAULT, REMAP

MIB = 2**20
# The tolerance for remap's decode step against copy-and-grow's, every band.
DECODE_TOLERANCE = 0.02
BOUNDARY_LIMIT_S = 0.001  # remap's grow() at every boundary
PREFAULT_SHARE_OF_MEMCPY = 0.5


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.2f}"


def _prefault_share_range(
    samples: Sequence[Mapping[str, Any]] | None,
) -> list[tuple[float, float]] | None:
    """Per boundary, the pre-faulted copy's rate over memcpy's: the lowest over every pair
    of samples and the highest. None when the results kept no samples."""
    if samples is None:
        return None
    out = []
    starts = sorted({s["from_tokens"] for s in samples})
    for start in starts:

        def rates(arm: str, start: int = start) -> list[float]:
            return [
                s["copied_bytes"] / s["copy_seconds"]
                for s in samples
                if s["arm"] == arm and s["from_tokens"] == start and s["timed"]
                if s["copy_seconds"] > 0 and s["copied_bytes"]
            ]

        mine, flat = rates(PREFAULT), rates(MEMCPY)
        if mine and flat:
            out.append((min(mine) / max(flat), max(mine) / min(flat)))
    return out


def _every_sample(values: Sequence[tuple[float, float]], limit: float, at_least: bool) -> Verdict:
    """Per (lowest, highest) sample pair: met when every sample is on the right side of
    ``limit``, not met when every sample of some item is on the wrong side."""
    if not values:
        return Verdict.NOT_ESTABLISHED
    if at_least:
        if all(low >= limit for low, _ in values):
            return Verdict.MET
        if any(high < limit for _, high in values):
            return Verdict.NOT_MET
    else:
        if all(high <= limit for _, high in values):
            return Verdict.MET
        if any(low > limit for low, _ in values):
            return Verdict.NOT_MET
    return Verdict.NOT_ESTABLISHED


def targets(
    boundary: Mapping[str, Any],
    memory: Mapping[str, Any],
    part2: Mapping[str, Any],
    samples: Sequence[Mapping[str, Any]] | None,
) -> list[tuple[str, str, Verdict]]:
    """The issue's 'done when' figures, each with its verdict: counts and bytes by their
    value, timings by every sample or by a 95% interval, never by a median alone."""
    arms = memory["arms"]
    remap, copy = arms[REMAP], arms[COPY]
    direct_kv = memory["direct_kv_bytes"]
    rows = part2["bands"].get(REMAP, [])
    agree = part2["agreement"][REMAP]

    def exact(ok: bool) -> Verdict:
        return Verdict.MET if ok else Verdict.NOT_MET

    band_verdict = combined(
        [within(Interval(r["relative_change"], r["ci_low"], r["ci_high"]), 0.0, DECODE_TOLERANCE)
         for r in rows]
    )  # fmt: skip
    widest = max((max(-r["ci_low"], r["ci_high"]) for r in rows), default=float("nan"))
    shares = _prefault_share_range(samples)
    share_text = (
        "no samples kept (results format 1): medians only, lowest "
        f"{100 * boundary['prefault_vs_memcpy_min']:.0f}%"
        if shares is None
        else "every sample pair: lowest "
        + f"{100 * min(low for low, _ in shares):.0f}%, highest "
        + f"{100 * max(high for _, high in shares):.0f}%"
    )
    limit_ms = 1000 * BOUNDARY_LIMIT_S
    return [
        (
            "remap logits = copy-and-grow's at every step (top-1 all equal, cosine ≥ 0.9999999)",
            f"{agree['top1_equal']}/{agree['steps']} top-1, min cosine {agree['min_cosine']:.9f}",
            exact(agree["top1_equal"] == agree["steps"] and agree["min_cosine"] >= 0.9999999),
        ),
        (
            f"bytes copied at a boundary: 0 (over {boundary['boundaries']} boundaries, live "
            f"KV {boundary['live_ratio']:.0f}x apart)",
            f"{boundary['remap_copied_bytes']} bytes",
            exact(
                boundary["remap_copied_bytes"] == 0
                and boundary["boundaries"] >= 4
                and boundary["live_ratio"] >= 8
            ),
        ),
        (
            f"remap boundary time ≤ {limit_ms:g} ms at every boundary, every sample",
            f"slowest sample {1000 * boundary['remap_slowest_s']:.2f} ms; medians "
            f"{boundary['remap_min_ms']:.2f}–{boundary['remap_max_ms']:.2f} ms",
            _every_sample(boundary["remap_sample_ranges_s"], BOUNDARY_LIMIT_S, at_least=False),
        ),
        (
            "physical KV token-weighted ≤ 0.55x the direct graph's (pages per token: no "
            "timing in it)",
            f"{remap['physical_token_weighted_bytes'] / direct_kv:.3f}x",
            exact(remap["physical_token_weighted_bytes"] <= 0.55 * direct_kv),
        ),
        (
            "physical KV time-weighted below copy-and-grow's (its physical; its reserved in "
            "brackets)",
            f"{_mib(remap['physical_time_weighted_bytes'])} vs "
            f"{_mib(copy['physical_time_weighted_bytes'])} MiB "
            f"({_mib(copy['reserved_time_weighted_bytes'])} MiB); one run, so no interval",
            Verdict.NOT_ESTABLISHED,
        ),
        (
            "physical peak ≤ 1.0x the direct graph's",
            f"{remap['physical_peak_bytes'] / direct_kv:.3f}x",
            exact(remap["physical_peak_bytes"] <= direct_kv),
        ),
        (
            f"decode step within {100 * DECODE_TOLERANCE:.0f}% of copy-and-grow's in every "
            f"band: every band's 95% CI inside ±{100 * DECODE_TOLERANCE:.0f}%",
            f"the widest CI end {100 * widest:.2f}% over {len(rows)} bands",
            band_verdict if rows else Verdict.NOT_ESTABLISHED,
        ),
        (
            f"pre-faulted copy ≥ {100 * PREFAULT_SHARE_OF_MEMCPY:.0f}% of memcpy bandwidth",
            share_text,
            Verdict.NOT_ESTABLISHED
            if shares is None
            else _every_sample(shares, PREFAULT_SHARE_OF_MEMCPY, at_least=True),
        ),
    ]


def targets_table(checks: Sequence[tuple[str, str, Verdict]]) -> list[str]:
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {v.bold()} |" for name, value, v in checks]
    return lines
