#!/usr/bin/env python3
"""The store's fault campaign: every fault class of issues 10 and 29 and the earlier ones, each
injected from outside and observed through real ``ovspec`` processes on builtin:tiny.

Prints one table row per fault class as it finishes, then the totals; with --write it
also saves the results and regenerates docs/benchmarks/reliability.md from them. Some
classes need root (tmpfs, bind mounts, chown); without it they say "skipped" in their row.

    sudo python tools/faults.py --write docs/benchmarks
    python tools/faults.py --only link --keep /tmp/faults   # a subset; keep the stores
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.common.pages import write_page
from ovspec.bench.faults.cases import CASES, prepare
from ovspec.bench.faults.harness import FaultResult, format_table, run_campaign, totals
from ovspec.bench.faults.page import PAGE

LOAD_AT_START = load_average()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--only", default=None, help="Run the classes whose name contains this text.")
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Work in this folder and keep it (default: a temp folder, removed after).",
)
@click.option(
    "--write",
    "write_to",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also save the results and the page rendered from them in this folder "
    "(docs/benchmarks: reliability.md and results/reliability.json).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON at the end.")
def main(only: str | None, keep: Path | None, write_to: Path | None, as_json: bool) -> None:
    cases = [c for c in CASES if only is None or only.lower() in c.name.lower()]
    if not cases:
        raise click.UsageError(f"no fault class matches {only!r}")
    began = time.perf_counter()
    header = format_table([])
    click.echo("\n".join(header))

    def show(result: FaultResult) -> None:
        click.echo(format_table([result])[-1])

    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        results = run_campaign(keep, cases, on_result=show, prepare=prepare)
    else:
        with tempfile.TemporaryDirectory(prefix="ovspec-faults-") as work:
            results = run_campaign(Path(work), cases, on_result=show, prepare=prepare)
    wall_s = time.perf_counter() - began
    summary = totals(results)
    click.echo(f"\n{summary}; wall {wall_s:.0f} s")
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=1))
    if write_to is not None:
        command = shlex.join(["python", "tools/faults.py", *sys.argv[1:]])
        document = {
            "command": command,
            "wall_s": wall_s,
            "environment": dataclasses.asdict(environment(LOAD_AT_START)),
            "results": [r.to_json() for r in results],
        }
        click.echo(f"wrote {write_page(write_to, PAGE, document)}")
    if any(not r.ok for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
