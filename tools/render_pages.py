#!/usr/bin/env python3
"""Re-render benchmark pages from their committed results, running no benchmark:

python tools/render_pages.py              # every page in docs/benchmarks
python tools/render_pages.py --check      # exit 1 if a page differs from its results
python tools/render_pages.py --page kv --json
"""

from __future__ import annotations

import json
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common import pages
from ovspec.cli import tool_errors
from ovspec.errors import BadRequestError

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--pages-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="The folder of the pages, with their results in results/.",
)
@click.option("--page", "names", multiple=True, help="Only this page (repeatable).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a page is stale.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def main(pages_dir: Path, names: tuple[str, ...], check: bool, as_json: bool) -> None:
    """Render each page from results/<page>.json and write it (or, with --check, compare)."""
    stale: list[str] = []
    written: list[str] = []
    with tool_errors("render_pages"):
        chosen = list(names) or sorted(pages.RENDERERS)
        for name in chosen:
            if not pages.results_path(pages_dir, name).is_file():
                raise BadRequestError(f"no results file for page {name!r} under {pages_dir}")
            text = pages.render_saved(pages_dir, name)
            target = pages_dir / f"{name}.md"
            current = target.read_text(encoding="utf-8") if target.is_file() else None
            if current == text:
                continue
            stale.append(name)
            if not check:
                target.write_text(text, encoding="utf-8")
                written.append(str(target))
    if as_json:
        click.echo(json.dumps({"pages": chosen, "stale": stale, "written": written}, indent=1))
    else:
        for name in stale:
            click.echo(f"{name}: {'stale' if check else 'written'}")
    if check and stale:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
