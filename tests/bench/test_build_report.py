"""The build benchmark's text report, from a report record made by hand."""

from __future__ import annotations

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


def sample_report() -> BenchReport:
    s = Spread.of
    env = Environment(
        "2026-12-01T00:00:00Z",
        "a CPU",
        4,
        2,
        8 << 30,
        "Linux",
        "3.12",
        "2026.0",
        "0.1.0",
        "abc1234",
        (0.5, 0.4, 0.3),
        (0.6, 0.5, 0.4),
    )
    keys = KeyFigures(
        2 << 30, s([0.1, 0.2]), None, s([1.0, 1.2]), s([0.01]), s([0.02]), s([0.001]), s([0.5])
    )
    specs = tuple(
        SpecFigures(
            mode,
            f"decode@{cap}",
            "decode",
            cap,
            0,
            s([2.0, 3.0]),
            s([0.1]),
            (1000, 1000 if mode == "full" else 1200),
            s([0.2]),
            s([0.003]),
        )
        for mode in ("weightless", "full")
        for cap in (32, 64)
    )
    ladders = tuple(
        LadderFigures(
            mode,
            2,
            s([5.0]),
            s([4.0]),
            s([0.2]),
            None if mode == "full" else s([0.8]),
            s([9.0]),
            s([0.05]),
            s([100.0]),
            s([0.4]),
            s([12.5]),
            None,
            "no ovspec on PATH" if mode == "full" else None,
            2000,
            4096,
            1000,
            ("a problem",) if mode == "full" else (),
            (0.5, 0.7),
        )
        for mode in ("weightless", "full")
    )
    return BenchReport(
        "tools/bench_build.py",
        env,
        "/tmp/m",
        "builtin:tiny",
        (32, 64),
        ("decode",),
        16,
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32"},
        2,
        1,
        keys,
        specs,
        ladders,
        StorageFigures(2 << 30, 2000, 4 << 30, 2 << 30),
        (RssMark("build", 3 << 30),),
        120.0,
    )


def test_the_report_has_every_table_and_note() -> None:
    text = format_report(sample_report())
    lines = text.splitlines()
    assert lines[0] == "ovspec build benchmark"
    assert "ladder 32,64 x decode (chunk 16) on CPU, config INFERENCE_PRECISION_HINT=f32" in text
    for title in (
        "Per specialization (cold compile/export; import and hit from a warm store)",
        "Key derivation (first key of a Compiler unless noted)",
        "Whole ladder (2 specializations), one fresh store per repeat",
        "Storage",
        "Peak RSS of this process (monotonic)",
    ):
        assert lines[lines.index(title) - 1] == ""
    assert "1,000 (to 1,200)" in text  # blob bytes that differ between repeats
    assert "cold: empty memo, .bin cached (2.0 GB/s)" in text
    assert "n/a (jobs > 1)" in text
    assert "  note: `ovspec build` (full): no ovspec on PATH" in text
    assert "  store.check() (full): a problem" in text
    assert "full / weightless ladder bytes = 2,147,484" in text
    assert lines[-1] == "  after build: 3.00 GiB"


def test_the_build_page_is_computed_from_samples_not_stored_medians() -> None:
    """The committed page renders from results/build.json's samples: rewriting every
    stored median and range changes nothing, changing one sample changes the page."""
    import copy
    import json
    from pathlib import Path

    from ovspec.bench.common import pages

    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
    document = json.loads(pages.results_path(docs, "build").read_text(encoding="utf-8"))
    text = pages.renderer("build")(document)
    assert text == (docs / "build.md").read_text(encoding="utf-8")

    def scrub(value: object) -> None:
        if isinstance(value, dict):
            if "samples" in value:
                value.update(median=-1.0, low=-1.0, high=-1.0, n=99)
            for child in value.values():
                scrub(child)
        elif isinstance(value, list):
            for child in value:
                scrub(child)

    scrubbed = copy.deepcopy(document)
    scrub(scrubbed)
    assert pages.renderer("build")(scrubbed) == text
    changed = copy.deepcopy(document)
    changed["ladders"][0]["cold_build_s"]["samples"][0] = 1234.5
    assert "1234.5" in pages.renderer("build")(changed).replace("1,234.5", "1234.5")
