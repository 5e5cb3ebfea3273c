#!/usr/bin/env python3
"""The ab-compile page's trials: two `ovspec ab-compile` runs on this machine's CPU, each
comparing two compile-property sets, their raw run records saved whole in
docs/benchmarks/results/ab-compile.json and the page rendered from them:

- a blob-neutral control (PERF_COUNT=NO against YES): the gate must say identical;
- a blob-changing control (this CPU's positive control, ``blob_control``): it must not.

    python tools/bench_abcompile.py                                   # the page's run
    python tools/bench_abcompile.py --model builtin:tiny --rungs 32,64 --pairs 2 --out /tmp/ab
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.abcompile.page import PAGE
from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.common.pages import results_path, write_page
from ovspec.cli import tool_errors
from ovspec.errors import BadRequestError

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def _trials() -> list[dict[str, Any]]:
    """Each trial's title, what it shows, and its arms' options."""
    import openvino as ov

    from ovspec.compile.devices.facts import blob_control

    name, value = blob_control(ov.Core(), "CPU")
    return [
        {
            "title": "Blob-neutral control: PERF_COUNT=NO against YES",
            "purpose": "A property that cannot change the compiled graph: the blobs must be "
            "byte-identical in every pair, and the compile times should show no difference.",
            "arms": ["--a-label", "perf-off", "--a-config", "PERF_COUNT=NO",
                     "--b-label", "perf-on", "--b-config", "PERF_COUNT=YES"],
        },
        {
            "title": f"Blob-changing control: {name}={value}",
            "purpose": "This CPU's positive control (`blob_control`: a property that changes "
            "the exported blob here): the gate must see different blobs in every pair.",
            "arms": ["--a-label", "default", "--b-label", f"{name}={value}",
                     "--b-config", f"{name}={value}"],
        },
    ]  # fmt: skip


def _records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return lines[0], lines[1:]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:small", show_default=True)
@click.option("--rungs", default="128,256", show_default=True)
@click.option("--pairs", type=click.IntRange(min=2), default=6, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where ab-compile.md and results/ab-compile.json go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the page and results went.")
def main(model: str, rungs: str, pairs: int, out: Path, as_json: bool) -> None:
    """Run the page's ab-compile trials and render the page from their run records."""
    began = time.perf_counter()
    load_start = load_average()
    trials = []
    with tool_errors("bench_abcompile"), tempfile.TemporaryDirectory() as scratch:
        for k, trial in enumerate(_trials()):
            results = Path(scratch) / f"trial-{k}.jsonl"
            store = Path(scratch) / "store"
            args = ["ab-compile", model, "--pairs", str(pairs), "--rungs", rungs,
                    *trial["arms"], "--out", str(results), "--cache-dir", str(store)]  # fmt: skip
            click.echo(f"bench_abcompile: {trial['title']}", err=True)
            cli = [sys.executable, "-c", "from ovspec.cli import main; main()"]
            done = subprocess.run([*cli, *args], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise BadRequestError(f"ovspec ab-compile failed (exit {done.returncode}): {last}")
            header, runs = _records(results)
            trials.append(
                {
                    "title": trial["title"],
                    "purpose": trial["purpose"],
                    "command": shlex.join(["ovspec", *args[:-4], "--out", f"trial-{k}.jsonl"]),
                    "header": header,
                    "runs": runs,
                }
            )
        document = {
            "command": shlex.join(["python", "tools/bench_abcompile.py", *sys.argv[1:]]),
            "model": model,
            "environment": environment(load_start).__dict__,
            "wall_s": time.perf_counter() - began,
            "trials": trials,
        }
        page = write_page(out, PAGE, document)
    if as_json:
        click.echo(json.dumps({"page": str(page), "results": str(results_path(out, PAGE))}))
    else:
        click.echo(page.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
