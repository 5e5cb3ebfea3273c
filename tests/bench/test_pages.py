"""Benchmark pages are generated: every committed results file renders to exactly the
committed page (a hand edit, or a renderer change without a re-render, fails here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovspec.bench import pages

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
SAVED = sorted(p.stem for p in (DOCS / pages.RESULTS_FOLDER).glob("*.json"))


def test_every_registered_page_has_its_results_committed() -> None:
    assert SAVED, "no benchmark results are committed"
    assert sorted(pages.RENDERERS) == SAVED


@pytest.mark.parametrize("page", SAVED)
def test_the_committed_page_is_its_results_rendered(page: str) -> None:
    assert (DOCS / f"{page}.md").read_text(encoding="utf-8") == pages.render_saved(DOCS, page)
