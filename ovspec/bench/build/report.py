"""The build benchmark's report as text: tables of per-specialization, ladder, key and
storage figures, each with the environment it was measured in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ovspec.bench.build.records import BenchReport, LadderFigures

# --------------------------------------------------------------------------- text output


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def format_report(r: BenchReport) -> str:
    n = r.ladders[0].specializations if r.ladders else 0
    return "\n".join(
        [
            *_header(r),
            "",
            "Per specialization (cold compile/export; import and hit from a warm store)",
            *_spec_table(r),
            "",
            "Key derivation (first key of a Compiler unless noted)",
            *_key_table(r),
            "",
            f"Whole ladder ({n} specializations), one fresh store per repeat",
            *_ladder_table(r),
            "",
            "Storage",
            *_storage_lines(r, n),
            "",
            "Peak RSS of this process (monotonic)",
            *(f"  after {m.after}: {_gib(m.peak_rss_bytes)}" for m in r.rss),
        ]
    )


def _header(r: BenchReport) -> list[str]:
    env, k = r.environment, r.keys
    return [
        "ovspec build benchmark",
        f"command: {r.command}",
        f"date: {env.date_utc}   duration: {r.duration_s / 60:.1f} min",
        f"machine: {env.cpu_model}, {env.logical_cores} logical cores "
        f"({env.usable_cores} usable), {_gib(env.memory_bytes)} RAM, {env.os}",
        f"software: OpenVINO {env.openvino}, Python {env.python}, "
        f"ovspec {env.ovspec} (git {env.git_commit})",
        "load average (1/5/15 min) at start: "
        + "/".join(f"{x:.2f}" for x in env.load_average_start)
        + ", at end: "
        + "/".join(f"{x:.2f}" for x in env.load_average_end),
        f"model: {r.model_reference} -> {r.model}",
        f"       weights (.bin) {k.weights_bytes:,} B = {_mib(k.weights_bytes)}",
        f"ladder {','.join(map(str, r.ladder))} x {','.join(r.phases)} (chunk {r.chunk_tokens}) "
        f"on {r.device}, config {_properties_text(r.properties)}, jobs {r.jobs}, "
        f"repeats {r.repeats}",
        "figures: median (min–max) over the repeats; seconds unless marked",
    ]


def _spec_table(r: BenchReport) -> list[str]:
    rows = [
        [
            s.blob_mode,
            s.specialization,
            s.compile_s.text(2),
            s.export_s.text(3),
            f"{s.blob_bytes[0]:,}"
            + ("" if len(set(s.blob_bytes)) == 1 else f" (to {max(s.blob_bytes):,})"),
            s.import_s.text(3),
            s.hit_s.text(4),
        ]
        for s in r.specs
    ]
    return _table(
        ["mode", "specialization", "compile s", "export s", "blob bytes", "import s", "hit s"],
        rows,
    )


def _key_table(r: BenchReport) -> list[str]:
    k = r.keys
    hash_gb_s = k.weights_bytes / 1e9 / k.cold_cached_s.median
    return _table(
        ["case", "seconds"],
        [
            ["Compiler start (ov.Core + device facts)", k.compiler_start_s.text(4)],
            [
                "cold: empty memo, .bin dropped from page cache",
                k.cold_uncached_s.text(4) if k.cold_uncached_s else "n/a",
            ],
            [
                f"cold: empty memo, .bin cached ({hash_gb_s:.1f} GB/s)",
                k.cold_cached_s.text(4),
            ],
            ["warm: new Compiler, memo in memory", k.memo_memory_s.text(5)],
            ["warm: new Compiler, new memo object on disk", k.memo_disk_s.text(5)],
            ["next key, same Compiler", k.next_key_s.text(6)],
            ["(IR read + prepare, for scale)", k.prepare_s.text(3)],
        ],
    )


LADDER_ROWS: tuple[tuple[str, Callable[[LadderFigures], str]], ...] = (
    ("cold build s (empty store)", lambda f: f.cold_build_s.text(2)),
    ("  sum of compile s", lambda f: f.cold_compile_s.text(2)),
    ("  sum of export s", lambda f: f.cold_export_s.text(2)),
    (
        "  other s (keys, IR, store commits)",
        lambda f: f.cold_other_s.text(2) if f.cold_other_s else "n/a (jobs > 1)",
    ),
    ("  process CPU s (user+sys)", lambda f: f.cold_cpu_s.text(1)),
    ("warm build s (all hits)", lambda f: f.warm_build_s.text(4)),
    ("cold / warm build", lambda f: f.cold_over_warm.text(0)),
    ("warm load s (hit + import, each)", lambda f: f.warm_load_s.text(2)),
    ("cold / warm load", lambda f: f.cold_over_warm_load.text(1)),
    (
        "warm `ovspec build`, new process s",
        lambda f: f.cli_warm_build_s.text(2) if f.cli_warm_build_s else "n/a",
    ),
    ("ladder blob bytes", lambda f: f"{f.blob_bytes:,}"),
    ("store bytes on disk (all files)", lambda f: f"{f.store_bytes:,}"),
    (
        "load average (1 min) at each cold start",
        lambda f: " ".join(f"{x:.1f}" for x in f.load_average_1m),
    ),
)


def _ladder_table(r: BenchReport) -> list[str]:
    out = _table(
        ["", *(f.blob_mode for f in r.ladders)],
        [[name, *(get(f) for f in r.ladders)] for name, get in LADDER_ROWS],
    )
    for f in r.ladders:
        if f.cli_error:
            out.append(f"  note: `ovspec build` ({f.blob_mode}): {f.cli_error}")
        if f.check_problems:
            out.append(f"  store.check() ({f.blob_mode}): {'; '.join(f.check_problems)}")
    return out


def _storage_lines(r: BenchReport, n: int) -> list[str]:
    st = r.storage
    rows = [["model weights (.bin)", f"{st.model_bin_bytes:,}", _mib(st.model_bin_bytes)]]
    for name, value in (
        ("weightless ladder (blobs)", st.weightless_ladder_bytes),
        ("full ladder (blobs)", st.full_ladder_bytes),
        (f"one full blob, top rung {r.ladder[-1]}", st.one_full_blob_bytes),
    ):
        if value is not None:
            rows.append([name, f"{value:,}", _mib(value)])
    out = _table(["", "bytes", ""], rows)
    if st.weights_copies_full is not None and st.weightless_ladder_bytes is not None:
        out.append(
            f"full ladder / .bin = {st.weights_copies_full:.2f} for {n} specializations; "
            f"(weightless ladder + .bin) / .bin = "
            f"{(st.weightless_ladder_bytes + st.model_bin_bytes) / st.model_bin_bytes:.3f}"
        )
    if st.full_over_weightless is not None:
        out.append(f"full / weightless ladder bytes = {st.full_over_weightless:,.0f}")
    return out


def _properties_text(properties: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in properties.items()) or "none"
