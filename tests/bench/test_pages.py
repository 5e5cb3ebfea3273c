"""Benchmark pages are generated: every committed results file renders to exactly the
committed page (a hand edit, or a renderer change without a re-render, fails here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ovspec.bench.common import pages

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
SAVED = sorted(p.stem for p in (DOCS / pages.RESULTS_FOLDER).glob("*.json"))
PAGES = sorted(p.stem for p in DOCS.glob("*.md"))


def test_every_page_has_a_renderer_and_its_results_committed() -> None:
    """A page with no results file, or no renderer, is a pasted page: it fails here."""
    assert PAGES, "no benchmark pages"
    assert sorted(pages.RENDERERS) == PAGES, "every page needs a renderer in pages.RENDERERS"
    assert PAGES == SAVED, "every page needs its results/<page>.json committed"


@pytest.mark.parametrize("page", PAGES)
def test_the_committed_page_is_its_results_rendered(page: str) -> None:
    assert pages.results_path(DOCS, page).is_file(), f"{page}.md has no results file"
    assert (DOCS / f"{page}.md").read_text(encoding="utf-8") == pages.render_saved(DOCS, page)


def test_every_image_a_page_shows_is_committed_and_used() -> None:
    images = {p.name for p in DOCS.glob("*.png")}
    shown = {
        name
        for name in images
        if any(name in (DOCS / f"{page}.md").read_text(encoding="utf-8") for page in PAGES)
    }
    assert images == shown, f"images no page shows: {sorted(images - shown)}"


def test_the_bench_page_says_which_threads_the_split_pins() -> None:
    """Results from before 2026-12-01 pinned the whole decode process; newer ones record
    that only the decode thread is on the device cores, and the page says so."""
    document = json.loads(pages.results_path(DOCS, "bench").read_text(encoding="utf-8"))
    document["config"].pop("split_pinning", None)  # as results from before it was recorded
    old = pages.renderer("bench")(document)
    document["config"]["split_pinning"] = "decode_thread"
    new = pages.renderer("bench")(document)
    assert "(every thread, before OpenVINO starts" in old
    assert "the decode thread is pinned to the device core" not in old
    assert "the decode thread is pinned to the device core" in new
    assert "(every thread, before OpenVINO starts" not in new
