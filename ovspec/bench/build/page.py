"""The build benchmark's page (docs/benchmarks/build.md), rendered from its saved report
alone: every figure is recomputed from the per-repeat samples the report keeps (a stored
median or range is never read), then shown as the text report and a computed summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.bench.build.records import (
    BenchReport,
    KeyFigures,
    LadderFigures,
    RssMark,
    SpecFigures,
    StorageFigures,
)
from ovspec.bench.build.report import format_report
from ovspec.bench.common.records import Environment, Spread
from ovspec.bench.common.verdicts import Interval, paired_ratio

PAGE = "build"


def _spread(saved: Mapping[str, Any] | None) -> Spread | None:
    return None if saved is None else Spread.of([float(x) for x in saved["samples"]])


def _required(saved: Mapping[str, Any]) -> Spread:
    return Spread.of([float(x) for x in saved["samples"]])


def _ratio_spread(top: Spread, bottom: Spread) -> Spread:
    return Spread.of([a / b for a, b in zip(top.samples, bottom.samples, strict=True)])


def _ladder(saved: Mapping[str, Any]) -> LadderFigures:
    cold, warm, load = (
        _required(saved["cold_build_s"]),
        _required(saved["warm_build_s"]),
        _required(saved["warm_load_s"]),
    )
    return LadderFigures(
        blob_mode=saved["blob_mode"],
        specializations=saved["specializations"],
        cold_build_s=cold,
        cold_compile_s=_required(saved["cold_compile_s"]),
        cold_export_s=_required(saved["cold_export_s"]),
        cold_other_s=_spread(saved["cold_other_s"]),
        cold_cpu_s=_required(saved["cold_cpu_s"]),
        warm_build_s=warm,
        cold_over_warm=_ratio_spread(cold, warm),
        warm_load_s=load,
        cold_over_warm_load=_ratio_spread(cold, load),
        cli_warm_build_s=_spread(saved["cli_warm_build_s"]),
        cli_error=saved["cli_error"],
        blob_bytes=saved["blob_bytes"],
        store_bytes=saved["store_bytes"],
        largest_blob_bytes=saved["largest_blob_bytes"],
        check_problems=tuple(saved["check_problems"]),
        load_average_1m=tuple(saved["load_average_1m"]),
    )


def _spec(saved: Mapping[str, Any]) -> SpecFigures:
    return SpecFigures(
        blob_mode=saved["blob_mode"],
        specialization=saved["specialization"],
        phase=saved["phase"],
        capacity_tokens=saved["capacity_tokens"],
        chunk_tokens=saved["chunk_tokens"],
        compile_s=_required(saved["compile_s"]),
        export_s=_required(saved["export_s"]),
        blob_bytes=tuple(saved["blob_bytes"]),
        import_s=_required(saved["import_s"]),
        hit_s=_required(saved["hit_s"]),
    )


def report_from_json(document: Mapping[str, Any]) -> BenchReport:
    """The report a saved document holds, every figure rebuilt from its samples."""
    keys = document["keys"]
    env = dict(document["environment"])
    for name in ("load_average_start", "load_average_end"):
        env[name] = tuple(env[name])
    specs = tuple(_spec(s) for s in document["specs"])
    storage = document["storage"]
    return BenchReport(
        command=document["command"],
        environment=Environment(**env),
        model=document["model"],
        model_reference=document["model_reference"],
        ladder=tuple(document["ladder"]),
        phases=tuple(document["phases"]),
        chunk_tokens=document["chunk_tokens"],
        device=document["device"],
        properties=dict(document["properties"]),
        repeats=document["repeats"],
        jobs=document["jobs"],
        keys=KeyFigures(
            weights_bytes=keys["weights_bytes"],
            compiler_start_s=_required(keys["compiler_start_s"]),
            cold_uncached_s=_spread(keys["cold_uncached_s"]),
            cold_cached_s=_required(keys["cold_cached_s"]),
            memo_memory_s=_required(keys["memo_memory_s"]),
            memo_disk_s=_required(keys["memo_disk_s"]),
            next_key_s=_required(keys["next_key_s"]),
            prepare_s=_required(keys["prepare_s"]),
        ),
        specs=specs,
        ladders=tuple(_ladder(f) for f in document["ladders"]),
        storage=StorageFigures(
            model_bin_bytes=storage["model_bin_bytes"],
            weightless_ladder_bytes=storage["weightless_ladder_bytes"],
            full_ladder_bytes=storage["full_ladder_bytes"],
            one_full_blob_bytes=storage["one_full_blob_bytes"],
        ),
        rss=tuple(RssMark(m["after"], m["peak_rss_bytes"]) for m in document["rss"]),
        duration_s=document["duration_s"],
    )


def _ratio_text(interval: Interval | None, spread: Spread) -> str:
    paired = (
        "no interval (fewer than 2 repeats, or no spread)"
        if interval is None
        else f"{interval.estimate:.1f}× [95% CI {interval.low:.1f}, {interval.high:.1f}]"
    )
    return f"{paired}; per repeat {spread.text(1)}×"


def _pairs(top: Spread, bottom: Spread) -> Sequence[tuple[float, float]]:
    return list(zip(bottom.samples, top.samples, strict=True))


def _summary(report: BenchReport) -> list[str]:
    """Each blob mode's headline figures, computed from the samples."""
    lines = []
    for f in report.ladders:
        build = paired_ratio(_pairs(f.cold_build_s, f.warm_build_s))
        load = paired_ratio(_pairs(f.cold_build_s, f.warm_load_s))
        compile_share = [
            c / t for c, t in zip(f.cold_compile_s.samples, f.cold_build_s.samples, strict=True)
        ]
        lines.append(
            f"- {f.blob_mode}: a cold build of the {f.specializations} specializations "
            f"{f.cold_build_s.text(2)} s ({100 * min(compile_share):.0f}–"
            f"{100 * max(compile_share):.0f}% of it compiling), a warm build (all hits) "
            f"{f.warm_build_s.text(4)} s, loading the ladder from a warm store "
            f"{f.warm_load_s.text(2)} s; cold / warm build "
            f"{_ratio_text(build, f.cold_over_warm)}, cold build / warm load "
            f"{_ratio_text(load, f.cold_over_warm_load)}; the ladder's blobs "
            f"{f.blob_bytes:,} bytes, {f.blob_bytes / report.storage.model_bin_bytes:.3f}× "
            "the model's weights."
        )
    return lines


def render(document: Mapping[str, Any]) -> str:
    report = report_from_json(document)
    lines = [
        "# Build benchmark: what a ladder costs to build, key, import and store",
        "",
        "Generated by the command below from `results/build.json`; do not edit by hand. "
        f"Model `{report.model_reference}`, ladder {','.join(map(str, report.ladder))} × "
        f"{','.join(report.phases)}, {report.repeats} repeats, each in a fresh store; the "
        "two blob modes alternate AB/BA between repeats. Figures are the median (min–max) "
        "over the repeats; ratios are paired by repeat (geometric mean with a paired-t 95% "
        "interval over their logs). Nothing is checked against a time limit.",
        "",
        *_summary(report),
        "",
        "```sh",
        report.command,
        "```",
        "",
        "```",
        format_report(report),
        "```",
        "",
        "Per specialization, *hit s* is the store's part of a warm load (key, lookup, "
        "checksum, touch: the load's wall minus the import). Blob bytes show the first "
        "repeat's size and, where a later repeat exported a different size, the largest: "
        "an export that is not byte-identical between compiles.",
        "",
    ]
    return "\n".join(lines)
