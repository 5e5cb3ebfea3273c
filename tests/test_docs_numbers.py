"""Every measured figure in the prose is backed by a benchmark page, its raw results, or
a listed quotation with its source, so no number in README.md or the docs can drift
from what was measured.

A *measured figure* is a number followed by a unit: ``×``, ``x`` written against the
number (``1.07x``), ``%``, ``s``, ``ms``, ``µs``, ``ns``, ``min``, ``seconds``,
``minutes``, ``KiB``, ``MiB``, ``GiB``, ``kB``, ``MB``, ``GB``, ``tokens/s``, ``tok/s``,
``ms/token``, ``µs/token``, ``ms/step``, ``GB/s``, ``core-seconds``. Numbers joined by
``-``, ``–``, ``/``, ``to`` or ``vs`` before one unit (``0.89-1.09×``, ``1.12 / 1.02×``,
``1.79 vs 2.03 s``) and a bracketed interval (``[−1.3, +2.3]%``) make one figure, each
of whose numbers must be backed. Not figures: a number with no unit after it (ladder
1K/2K, ``--repetitions 5``, N = 5, 2 cores, version 2026.4.1, commit ids, §10.15), a
number glued to the word before it (s25, int8), and the confidence level ``95% CI``.

A figure is *backed* when a generated page states the number or its raw results hold
it, and the paragraph or list item holding the figure links that page (or its results):
a generated page is ``docs/benchmarks/NAME.md`` beside ``results/NAME.json``.
Numbers are compared at the precision written (``16.8 s`` is backed by 16.779 s or
16779 ms), without their sign, across units of one kind (s/ms/min, MiB/bytes, and a
plain number backs a percentage a hundred times larger). A JSON number's unit comes
from its key's ending (``_s``, ``_ms``, ``_bytes``, ``_mib``); one without backs only a
ratio or a percentage; a list of more than 8 bare numbers (a raw sample series) is not
searched. Else the figure is listed in
``tests/data/quoted_figures.toml`` with its file and source (the seed write-up, an
upstream document, a setting, or a measurement kept as history: commit and date); an
entry whose figure no longer appears fails, so the list cannot rot.

The check is on numbers, not meaning: a figure that happens to round to another number
of its linked page passes, and what the sentence around it claims is for review.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 fallback
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks"
ALLOWED = Path(__file__).parent / "data" / "quoted_figures.toml"
WRITEUP = ROOT / "docs" / "seed" / "compile-ahead-not-up-front.txt"
# Where a listed figure may come from: the seed write-up, a document or source outside
# ovspec, a setting or arithmetic, or a measurement kept only as prose (commit and date).
KINDS = frozenset({"write-up", "upstream", "definition", "history"})

# Unit -> (kind, factor to the kind's base unit). "x" counts only glued to its number.
UNITS: dict[str, tuple[str, float]] = {
    "tokens/s": ("rate", 1.0),
    "tok/s": ("rate", 1.0),
    "ms/token": ("per-token", 1e-3),
    "µs/token": ("per-token", 1e-6),
    "ms/step": ("per-token", 1e-3),
    "GB/s": ("bandwidth", 1e9),
    "core-seconds": ("time", 1.0),
    "seconds": ("time", 1.0),
    "minutes": ("time", 60.0),
    "min": ("time", 60.0),
    "ms": ("time", 1e-3),
    "µs": ("time", 1e-6),
    "ns": ("time", 1e-9),
    "s": ("time", 1.0),
    "KiB": ("bytes", 2.0**10),
    "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30),
    "kB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "%": ("percent", 1.0),
    "×": ("ratio", 1.0),
    "x": ("ratio", 1.0),
}
# JSON key endings that carry a unit; any other number is plain.
KEY_UNITS: dict[str, str] = {
    "_s": "s",
    "_seconds": "s",
    "_ms": "ms",
    "_bytes": "MiB",
    "_mib": "MiB",
    "_gib": "GiB",
    "_per_s": "tokens/s",
}
RAW_SERIES_MIN_LENGTH = 9

_NUM = r"[+\-−±~≈]?\d+(?:,\d{3})*(?:\.\d+)?"
_JOIN = r"(?:\s*[-–—/…]\s*|\s+(?:to|vs\.?)\s+)"
# Longest first, so "ms/token" wins over "ms"; "x" apart, as it must be glued.
_UNIT = "|".join(re.escape(u) for u in sorted(set(UNITS) - {"x"}, key=len, reverse=True))
_AFTER = r"(?![\w/])(?!\s*(?:CI|confidence|interval))"
FIGURE = re.compile(
    rf"(?<![\w.§])(?:\[\s*{_NUM}\s*,\s*{_NUM}\s*\]|{_NUM}(?:{_JOIN}{_NUM})*)"
    rf"(?:\s?(?P<unit>{_UNIT})|(?P<glued>x)){_AFTER}"
)
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
PAGE_LINK = re.compile(r"benchmarks/(?:results/)?([\w.-]+?)\.(?:md|json)\b")
FENCE = re.compile(r"^(```|~~~)")


@dataclass(frozen=True)
class Figure:
    """One measured figure as written: where, its text, its unit and its numbers."""

    path: str
    line: int
    text: str
    unit: str
    numbers: tuple[str, ...]
    pages: frozenset[str]  # benchmark pages linked from its paragraph or list item


def find_figures(text: str, path: str) -> list[Figure]:
    """The measured figures of one markdown text, each with the pages its block links."""
    figures: list[Figure] = []
    for start, block in _blocks(text):
        pages = frozenset(PAGE_LINK.findall(block))
        for match in FIGURE.finditer(block):
            unit = match.group("unit") or match.group("glued")
            figure_text = " ".join(match.group(0).split())
            line = start + block.count("\n", 0, match.start())
            numbers = tuple(NUMBER.findall(match.group(0)))
            figures.append(Figure(path, line, figure_text, unit, numbers, pages))
    return figures


def _blocks(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) per paragraph, fenced block or top-level list item."""
    lines = text.splitlines()
    start, fenced = 1, False
    current: list[str] = []
    for number, line in enumerate(lines, 1):
        opens_item = line.startswith(("- ", "* ")) or bool(re.match(r"\d+\. ", line))
        if FENCE.match(line):
            fenced = not fenced
        ends = not fenced and (not line.strip() or (opens_item and current))
        if ends and current:
            yield start, "\n".join(current)
            current = []
        if line.strip() or fenced:
            if not current:
                start = number
            current.append(line)
    if current:
        yield start, "\n".join(current)


def _value(number: str) -> tuple[float, float]:
    """The number's value and half a unit of its last written digit."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number.replace(",", "")), 0.5 * 10.0**-decimals


@dataclass
class Evidence:
    """What one generated page and its raw results state: numbers by kind, in base units."""

    by_kind: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, value: float) -> None:
        self.by_kind.setdefault(kind, []).append(abs(value))

    def seal(self) -> None:
        for values in self.by_kind.values():
            values.sort()

    def holds(self, kind: str, low: float, high: float) -> bool:
        values = self.by_kind.get(kind, [])
        slack = 1e-9 * max(abs(low), abs(high), 1e-12)
        at = bisect.bisect_left(values, low - slack)
        return at < len(values) and values[at] <= high + slack

    def backs(self, unit: str, number: str) -> bool:
        kind, factor = UNITS[unit]
        value, half = _value(number)
        low, high = (value - half) * factor, (value + half) * factor
        plain = ["plain", "unitless"] if kind in {"ratio", "percent"} else ["plain"]
        if self.holds(kind, low, high) or any(
            self.holds(p, value - half, value + half) for p in plain
        ):
            return True
        return kind == "percent" and any(
            self.holds(p, (value - half) / 100, (value + half) / 100) for p in plain
        )


def page_evidence(page: Path, results: Path) -> Evidence:
    """Numbers of a generated page (unit-bearing ones by kind, the rest plain) and of its
    results JSON (by key ending, raw sample series left out)."""
    evidence = Evidence()
    text = page.read_text(encoding="utf-8")
    for figure in find_figures(text, page.name):
        kind, factor = UNITS[figure.unit]
        for number in figure.numbers:
            evidence.add(kind, _value(number)[0] * factor)
    for number in NUMBER.findall(FIGURE.sub(" ", text)):
        evidence.add("plain", _value(number)[0])
    _add_json(evidence, json.loads(results.read_text(encoding="utf-8")), "")
    evidence.seal()
    return evidence


def _add_json(evidence: Evidence, node: object, key: str) -> None:
    if isinstance(node, dict):
        for name, child in node.items():
            _add_json(evidence, child, str(name))
    elif isinstance(node, list):
        bare = all(isinstance(item, (int, float)) for item in node)
        if not (bare and len(node) >= RAW_SERIES_MIN_LENGTH):
            for item in node:
                _add_json(evidence, item, key)
    elif isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
        unit = next((u for end, u in KEY_UNITS.items() if key.lower().endswith(end)), None)
        if unit is None:  # a count, a setting or a ratio: it may back a ratio only
            evidence.add("unitless", float(node))
        elif unit == "MiB" and key.lower().endswith("_bytes"):
            evidence.add("bytes", float(node))
        else:
            kind, factor = UNITS[unit]
            evidence.add(kind, float(node) * factor)


def generated_pages(benchmarks: Path) -> dict[str, Evidence]:
    """Every generated page by name: a page with a results file of the same name."""
    return {
        results.stem: page_evidence(benchmarks / f"{results.stem}.md", results)
        for results in sorted((benchmarks / "results").glob("*.json"))
        if (benchmarks / f"{results.stem}.md").is_file()
    }


@dataclass(frozen=True)
class Quoted:
    """A listed figure: its text as written in one file and where it comes from."""

    figure: str
    path: str
    kind: str  # one of KINDS
    source: str
    commit: str = ""
    date: str = ""


def load_quoted(path: Path) -> list[Quoted]:
    """The allow-list: one ``[[quote]]`` table per source, each naming its figures."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    quoted: list[Quoted] = []
    for entry in data.get("quote", []):
        for figure in entry["figures"]:
            quoted.append(
                Quoted(
                    figure,
                    entry["file"],
                    entry["kind"],
                    entry["source"],
                    entry.get("commit", ""),
                    entry.get("date", ""),
                )
            )
    return quoted


def unbacked(
    figures: list[Figure], pages: dict[str, Evidence], quoted: list[Quoted]
) -> list[Figure]:
    """The figures no page, results file or quotation backs."""
    listed = {(q.path, q.figure) for q in quoted}
    missing: list[Figure] = []
    for figure in figures:
        if (figure.path, figure.text) in listed:
            continue
        scope = [pages[name] for name in figure.pages if name in pages]
        if not all(any(e.backs(figure.unit, n) for e in scope) for n in figure.numbers):
            missing.append(figure)
    return missing


def prose_files(root: Path) -> list[Path]:
    """README.md, docs/**/*.md but the generated pages, cache/ and patches/ READMEs."""
    docs = [
        path
        for path in sorted((root / "docs").rglob("*.md"))
        if path.parent != root / "docs" / "benchmarks"
    ]
    extra = [root / "cache" / "README.md", root / "patches" / "README.md"]
    return [root / "README.md", *docs, *(path for path in extra if path.is_file())]


def all_figures(root: Path) -> list[Figure]:
    figures: list[Figure] = []
    for path in prose_files(root):
        figures += find_figures(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return figures


@pytest.fixture(scope="module")
def pages() -> dict[str, Evidence]:
    return generated_pages(BENCHMARKS)


@pytest.fixture(scope="module")
def quoted() -> list[Quoted]:
    return load_quoted(ALLOWED)


def test_every_measured_figure_is_backed(pages: dict[str, Evidence], quoted: list[Quoted]) -> None:
    missing = unbacked(all_figures(ROOT), pages, quoted)
    report = "\n".join(f"  {f.path}:{f.line}: {f.text}" for f in missing)
    assert not missing, (
        f"{len(missing)} measured figures are backed by no generated page, results file "
        f"or entry of {ALLOWED.relative_to(ROOT)}:\n{report}"
    )


def test_every_quoted_figure_still_appears(quoted: list[Quoted]) -> None:
    written = {(f.path, f.text) for f in all_figures(ROOT)}
    stale = [q for q in quoted if (q.path, q.figure) not in written]
    assert not stale, (
        "quoted figures no longer in their file (drop them from the list):\n"
        + "\n".join(f"  {q.path}: {q.figure}" for q in stale)
    )


def test_every_quotation_names_a_checkable_source(quoted: list[Quoted]) -> None:
    writeup = Evidence()
    for number in NUMBER.findall(WRITEUP.read_text(encoding="utf-8")):
        writeup.add("plain", _value(number)[0])
    writeup.seal()
    for q in quoted:
        assert q.kind in KINDS, q
        assert q.source.strip(), q
        if q.kind == "write-up":  # every number rounds one of the write-up's
            for number in NUMBER.findall(q.figure):
                value, half = _value(number)
                assert writeup.holds("plain", value - half, value + half), (
                    f"{q.path}: {q.figure}: {number} is not the write-up's"
                )
        if q.kind == "history":
            assert re.fullmatch(r"[0-9a-f]{7,40}", q.commit), q
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", q.date), q


def test_history_commits_exist(quoted: list[Quoted]) -> None:
    commits = sorted({q.commit for q in quoted if q.commit})
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "--batch-check"],
        input="".join(f"{c}^{{commit}}\n" for c in commits),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("not a git checkout: the history commits cannot be looked up")
    missing = [line for line in probe.stdout.splitlines() if line.endswith("missing")]
    assert not missing, f"history entries name commits this repository lacks: {missing}"


# The checker itself, on synthetic pages: each of these fails if its rule breaks.


def _write_page(root: Path, name: str, page: str, results: object) -> None:
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / f"{name}.md").write_text(page, encoding="utf-8")
    (root / "results" / f"{name}.json").write_text(json.dumps(results), encoding="utf-8")


def test_what_counts_as_a_measured_figure() -> None:
    text = (
        "Ladder 1K/2K/4K, `--repetitions 5`, N = 5 on 2 cores, OpenVINO 2026.4.1 at "
        "94ab35b, see §10.15 and s25, int8 weights, 3 presets x doubling, a 95% CI.\n\n"
        "It took 35.9 s and 0.89-1.09×, [−1.3, +2.3]%, 1.79 vs 2.03 s, 1.07x, ~4%,\n"
        "1.12 / 1.02 /\n1.05× and 300 tokens/s.\n"
    )
    assert [f.text for f in find_figures(text, "t.md")] == [
        "35.9 s",
        "0.89-1.09×",
        "[−1.3, +2.3]%",
        "1.79 vs 2.03 s",
        "1.07x",
        "~4%",
        "1.12 / 1.02 / 1.05×",
        "300 tokens/s",
    ]


def test_the_checker_finds_what_nothing_backs(tmp_path: Path) -> None:
    _write_page(
        tmp_path,
        "speed",
        "| arm | first token s |\n|---|---|\n| genai | 2.03 |\n\nratio **0.88×**, wall 18.3 min\n",
        {"runs": [{"first_token_s": 1.7912, "peak_bytes": 15_225_000, "share": 0.2604}]},
    )
    _write_page(tmp_path, "kv", "remap 0.74 ms\n", {"grow_s": 0.5, "step_ms": [37.0] * 9})
    pages = generated_pages(tmp_path)
    prose = (
        "- [speed](docs/benchmarks/speed.md): 0.88×, 1.79 s, 1791 ms, 2.0 s, 14.5 MiB, "
        "26.0%, 18 min, wall 0.74 ms\n"
        "- no link: 0.74 ms, 12.3 s, 1.79-9.99 s\n"
        "- [kv](docs/benchmarks/kv.md) 500 ms, 37 ms\n"
    )
    figures = find_figures(prose, "README.md")
    # 2.0 s rounds 2.03; 0.74 ms is kv's, not the linked page's; 37 ms only a raw series.
    assert [f.text for f in unbacked(figures, pages, [])] == [
        "0.74 ms",
        "0.74 ms",
        "12.3 s",
        "1.79-9.99 s",
        "37 ms",
    ]
    listed = [Quoted("12.3 s", "README.md", "history", "a probe", "0" * 7, "2026-12-01")]
    assert "12.3 s" not in [f.text for f in unbacked(figures, pages, listed)]


def test_a_page_without_results_backs_nothing(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "build.md").write_text("cold ladder 35.9 s\n", encoding="utf-8")
    figures = find_figures("[build](docs/benchmarks/build.md): 35.9 s\n", "README.md")
    assert unbacked(figures, generated_pages(tmp_path), []) == figures
