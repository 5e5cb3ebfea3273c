"""Benchmark pages are generated, never hand-edited: each page in docs/benchmarks/ is
rendered by code from a results file saved beside it.

A benchmark writes ``docs/benchmarks/results/<page>.json`` (its measurements, the
command that made them and the environment) and renders ``docs/benchmarks/<page>.md``
from it with the renderer registered here. tests/bench/test_pages.py renders every
committed results file again and compares it with the committed page, so a hand edit
(or a renderer change without a re-render) fails CI.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ovspec.errors import BadRequestError

# page name -> "module:function" rendering a results document into Markdown; a new
# benchmark page adds its line. Imported lazily: a renderer may pull in heavy modules
# the others do not need.
RENDERERS: dict[str, str] = {
    "ab-compile": "ovspec.bench.abcompile.page:render",
    "bench": "ovspec.bench.protocols.page:render",
    "build": "ovspec.bench.build.page:render",
    "chat": "ovspec.bench.chat.page:render",
    "kv": "ovspec.bench.kv.page:render",
    "long-context": "ovspec.bench.long.page:render",
    "npu-plugin": "ovspec.bench.npu.page:render",
    "npu-plugin-shared-cores": "ovspec.bench.npu.page:render_shared_cores",
    "noise-floor": "ovspec.bench.noise.page:render",
    "npu-weights": "ovspec.bench.npu.weights_page:render",
    "overlap": "ovspec.bench.overlap.analysis:render",
    "reliability": "ovspec.bench.faults.page:render",
    "remote": "ovspec.bench.remote.page:render",
    "serve": "ovspec.bench.serve.page:render",
    "speed": "ovspec.bench.speed.page:render_page",
    "sweep": "ovspec.bench.sweep.page:render",
}

RESULTS_FOLDER = "results"


def renderer(page: str) -> Callable[[Mapping[str, Any]], str]:
    if page not in RENDERERS:
        raise BadRequestError(
            f"no renderer for benchmark page {page!r}; known: {sorted(RENDERERS)}"
        )
    module_name, _, function = RENDERERS[page].partition(":")
    render: Callable[[Mapping[str, Any]], str] = getattr(
        importlib.import_module(module_name), function
    )
    return render


def results_path(pages_dir: Path, page: str) -> Path:
    return pages_dir / RESULTS_FOLDER / f"{page}.json"


def write_page(pages_dir: Path, page: str, results: Mapping[str, Any]) -> Path:
    """Save ``results`` and the page rendered from them; returns the page's path."""
    return write_page_with(pages_dir, page, results, renderer(page))


def write_page_with(
    pages_dir: Path,
    page: str,
    results: Mapping[str, Any],
    render: Callable[[Mapping[str, Any]], str],
) -> Path:
    """``write_page`` with the renderer given: a page not yet in ``RENDERERS`` (it is
    registered once its results are committed, as the pages test requires)."""
    text = render(results)
    data = results_path(pages_dir, page)
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    out = pages_dir / f"{page}.md"
    out.write_text(text, encoding="utf-8")
    return out


def render_saved(pages_dir: Path, page: str) -> str:
    """The page as its saved results render it now."""
    results = json.loads(results_path(pages_dir, page).read_text(encoding="utf-8"))
    return renderer(page)(results)
