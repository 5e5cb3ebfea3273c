#!/usr/bin/env python3
"""The ab-compile page's trials: `ovspec ab-compile` runs on this machine, each comparing
two compile-property sets, their raw run records saved whole in
docs/benchmarks/results/ab-compile.json and the page rendered from them. On the CPU:

- a blob-neutral control (PERF_COUNT=NO against YES): the gate must say identical;
- a blob-changing control (this CPU's positive control, ``blob_control``): it must not.

On the NPU plugin with NPUW on CPU subdevices (``--device NPU --config NPUW_DEVICES=CPU``),
the options ovspec's NPUW profile chooses: folding (its weightless default) against none
(its exact default), and one partition (NPUW_ONLINE_PIPELINE=NONE) against NPUW's default.

    python tools/bench_abcompile.py                                   # the page's run
    python tools/bench_abcompile.py --model builtin:tiny --rungs 32,64 --pairs 2 --out /tmp/ab
    python tools/bench_abcompile.py --devices NPU --model builtin:tiny --rungs 32 --pairs 2 \
        --out /tmp/ab-npu                                             # a smoke run of NPU's
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


DEVICES = ("CPU", "NPU")
# The NPU trials' device, and the NPUW profile's exact numerics given to both arms.
NPUW_ON_CPU = ["--device", "NPU", "--config", "NPUW_DEVICES=CPU",
               "--config", "INFERENCE_PRECISION_HINT=f32", "--config", "NPUW_F16IC=NO"]  # fmt: skip


def _trials(devices: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each trial of ``devices``: its title, what it shows, and its arms' options."""
    sections = dict(zip(DEVICES, (_cpu_trials, _npu_trials), strict=True))
    return [trial for section in devices for trial in sections[section]()]


def _npu_trials() -> list[dict[str, Any]]:
    """The NPUW options ovspec's profile sets (``compile/devices/npuw.py``)."""
    return [
        {
            "title": "NPU plugin (NPUW on CPU): folding, NPUW_FOLD=NO against "
            "NPUW_FOLD=YES + NPUW_FUNCALL_FOR_ALL=YES",
            "purpose": "ovspec's exact NPUW profile does not fold (folding stores f32 weights "
            "as f16); its weightless blobs fold every subgraph into functions (NPUW exports "
            "weightless only then). What folding costs or saves in compile time per rung.",
            "arms": [*NPUW_ON_CPU, "--a-label", "no-fold", "--a-config", "NPUW_FOLD=NO",
                     "--b-label", "fold-all", "--b-config", "NPUW_FOLD=YES",
                     "--b-config", "NPUW_FUNCALL_FOR_ALL=YES"],
        },
        {
            "title": "NPU plugin (NPUW on CPU): one partition, NPUW's default partitioning "
            "against NPUW_ONLINE_PIPELINE=NONE",
            "purpose": "On CPU subdevices NPUW's partitions buy nothing a CPU compile does not "
            "do (genai's NPU pipeline compiles its generate graph unpartitioned for its "
            "BEST_PERF hint); both arms unfolded. What one partition saves in compile time.",
            "arms": [*NPUW_ON_CPU, "--config", "NPUW_FOLD=NO", "--a-label", "partitioned",
                     "--b-label", "one-partition", "--b-config", "NPUW_ONLINE_PIPELINE=NONE"],
        },
    ]  # fmt: skip


def _cpu_trials() -> list[dict[str, Any]]:
    """Each CPU trial's title, what it shows, and its arms' options."""
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


def _devices(text: str) -> tuple[str, ...]:
    chosen = tuple(d.strip().upper() for d in text.split(",") if d.strip())
    unknown = [d for d in chosen if d not in DEVICES]
    if unknown or not chosen:
        raise BadRequestError(
            f"--devices {text!r}: name one or more of {', '.join(DEVICES)}, comma-separated"
        )
    return chosen


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
@click.option(
    "--devices",
    default=",".join(DEVICES),
    show_default=True,
    help="Whose trials to run: CPU (the plugin) and/or NPU (its plugin, NPUW on CPU).",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the page and results went.")
def main(model: str, rungs: str, pairs: int, out: Path, devices: str, as_json: bool) -> None:
    """Run the page's ab-compile trials and render the page from their run records."""
    began = time.perf_counter()
    load_start = load_average()
    trials = []
    with tool_errors("bench_abcompile"), tempfile.TemporaryDirectory() as scratch:
        for k, trial in enumerate(_trials(_devices(devices))):
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
