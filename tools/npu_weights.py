#!/usr/bin/env python3
"""How often the NPU path (NPUW on CPU subdevices) holds a model's weights: for a ladder
of rungs against its top rung alone, the store's blob bytes (the rungs' and the shared LM
head's and embedding's) and the peak RSS of a fresh process that imports every rung's
decode graph and runs each once. Three arms: full blobs (the weights in each), weightless
blobs naming the model's one weights bank (the profile's default), and weightless blobs
with a bank per rung (the control: what the bank saves). Then the runtime's own use: a
fresh process decodes through the ladder (or its top rung alone) with the one-ahead
loader, passed rungs released (its default) or kept, for a few generations (a later one
imports its rungs from the store again). Prints the figures and writes
docs/benchmarks/npu-weights.md with its raw samples (results/npu-weights.json); about
2 min for builtin:small:

    python tools/npu_weights.py
    python tools/npu_weights.py --model builtin:qwen2.5-0.5b --out /tmp/w
    python tools/npu_weights.py --rewrites \
        split-attention+last-position-logits+result-guard+shared-head+shared-embedding
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.common.pages import write_page
from ovspec.bench.npu.weights_page import PAGE, RESULTS_FORMAT
from ovspec.errors import ModelError
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.rewrites import RewriteSet

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"

NPUW = {"NPUW_DEVICES": "CPU", "NPUW_F16IC": "NO", "INFERENCE_PRECISION_HINT": "f32"}
# The decode arms keep NPUW_F16IC's default: with NPUW_F16IC=NO the folded prefill graphs
# of builtin:small fail unless the embedding is cut out ("ParameterMismatch ... f32 ...
# f16" or SIGSEGV, docs/npu.md), and --rewrites may leave it in.
DECODE_NPUW = {k: v for k, v in NPUW.items() if k != "NPUW_F16IC"}
# decode arm: passed rungs released (the one-ahead loader's default)
DECODE_ARMS = {"decode, passed rungs released": True, "decode, rungs kept": False}
PROMPT_TOKENS = 16
GENERATIONS = 3
# arm: (blob mode, a weights bank per rung)
ARMS = {"full": ("full", False), "weightless": ("weightless", False)}
ARMS["weightless, bank per rung"] = ("weightless", True)

# One fresh process: ``build`` compiles the rungs into the store; ``import`` imports
# them, each through its compiler (one for the ladder, or one per rung when each rung
# names its own bank), runs each once and reports its memory.
_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ovspec.compile.compiler import Compiler
from ovspec.compile.devices.npuw import WEIGHTS_BANK
from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.store.local import Store

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

root, model, store, mode, properties, capacities, per_rung, rewrites, action = sys.argv[1:]
rewrites = None if rewrites == "default" else RewriteSet.parse(rewrites)
model, store, properties = ModelDir.open(model), Store(Path(store)), json.loads(properties)
compilers = {}
def compiler(capacity):
    bank = {WEIGHTS_BANK: f"npu-weights-rung-{capacity}"} if per_rung == "1" else {}
    key = capacity if bank else 0
    if key not in compilers:
        compilers[key] = Compiler(model, "NPU", {**properties, **bank}, store, rewrites=rewrites,
                                  blob_mode=BlobMode(mode))
    return compilers[key]
if action == "build":
    built = [compiler(c).build(Specialization.decode(c)).blob_bytes
             for c in json.loads(capacities)]
    shared = [c.ends.build(1) for c in compilers.values()]  # the shared head and embedding
    print(json.dumps({"blob_bytes": built, "shared_bytes": sum(shared)}))
    sys.exit(0)
programs, rss = [], []
for capacity in json.loads(capacities):
    programs.append(compiler(capacity).load(Specialization.decode(capacity)))
    programs[-1].compiled.create_infer_request().infer()
    rss.append(status("VmRSS"))
print(json.dumps({"rss_after_rung_bytes": rss, "peak_rss_bytes": status("VmHWM")}))
"""


# One fresh process decoding as a runtime does: ``ovspec.open`` (one-ahead, blobs through
# the store) and ``decode`` from a prompt to the top rung's last position, GENERATIONS
# times on one loader; per generation its peak RSS so far and the imports it made.
_DECODE_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import ovspec
from ovspec.runtime.decoding import decode
from ovspec.runtime.loader import EventKind

root, model, store, properties, ladder, release, rewrites, prompt, generations = sys.argv[1:]
rewrites = None if rewrites == "default" else rewrites
top, prompt, out = int(ladder.split(",")[-1]), int(prompt), []
with ovspec.open(model, ladder, device="NPU", properties=json.loads(properties), store=store,
                 rewrites=rewrites) as loader:
    for _ in range(int(generations)):
        seen = len(loader.events)
        decode(loader, list(range(1, prompt + 1)), max_new_tokens=top - prompt,
               release_passed_rungs=release == "1")
        loaded = [e.seconds for e in loader.events[seen:] if e.kind is EventKind.LOADED]
        peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                    if l.startswith("VmHWM:"))
        out.append({"peak_rss_bytes": peak, "load_s": loaded})
print(json.dumps({"generations": out}))
"""


def _child(args: list[str], script: str = _CHILD) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", script, root, *args], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _runs(
    model: str, capacities: list[int], rewrites: str, scratch: Path
) -> tuple[int, list[dict[str, Any]]]:
    model_dir = resolve_model(model, scratch / "models")
    runs: list[dict[str, Any]] = []
    for arm, (mode, per_rung) in ARMS.items():
        for rungs in (capacities[-1:], capacities):
            store = scratch / f"{mode}-{int(per_rung)}-{len(rungs)}"
            args = [str(model_dir.root), str(store), mode, json.dumps(NPUW), json.dumps(rungs)]
            args += ["1" if per_rung else "0", rewrites]
            built = _child([*args, "build"])
            imported = _child([*args, "import"])
            runs.append({"arm": arm, "blob_mode": mode, "rungs": rungs, **built, **imported})
    return model_dir.bin_path.stat().st_size, runs


def _decodes(
    model: str, capacities: list[int], rewrites: str, scratch: Path
) -> list[dict[str, Any]]:
    """Each decode arm on the ladder and on its top rung alone, each in a fresh process
    on a store a first (cold) run filled."""
    model_dir = resolve_model(model, scratch / "models")
    decodes: list[dict[str, Any]] = []
    for arm, release in DECODE_ARMS.items():
        for rungs in (capacities[-1:], capacities):
            store = scratch / f"decode-{len(rungs)}"
            args = [str(model_dir.root), str(store), json.dumps(DECODE_NPUW)]
            args += [",".join(map(str, rungs)), "1" if release else "0", rewrites]
            if not store.exists():  # a first (cold) run fills the store
                _child([*args, str(PROMPT_TOKENS), "1"], _DECODE_CHILD)
            ran = _child([*args, str(PROMPT_TOKENS), str(GENERATIONS)], _DECODE_CHILD)
            decodes.append({"arm": arm, "rungs": rungs, "release_passed_rungs": release, **ran})
    return decodes


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:small", show_default=True)
@click.option("--ladder", default="64,128,256,512", show_default=True)
@click.option(
    "--rewrites",
    default="default",
    show_default=True,
    help="The graphs' rewrite set (e.g. adding shared-embedding); default: the profile's.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=PAGES,
    show_default=True,
    help="Where npu-weights.md and results/npu-weights.json go.",
)
def main(model: str, ladder: str, rewrites: str, out: Path) -> None:
    try:
        capacities = [int(c) for c in ladder.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"takes comma-separated integers (got {ladder!r})", param_hint="--ladder"
        ) from None
    if capacities != sorted(set(capacities)) or capacities[-1] <= PROMPT_TOKENS:
        raise click.BadParameter(
            f"takes ascending rungs, the top one above the decode arms' {PROMPT_TOKENS}-token "
            f"prompt (got {ladder!r})",
            param_hint="--ladder",
        )
    if rewrites != "default":
        try:
            RewriteSet.parse(rewrites)
        except ModelError as exc:
            raise click.BadParameter(str(exc), param_hint="--rewrites") from None
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="npu-weights-") as scratch:
        bin_bytes, runs = _runs(model, capacities, rewrites, Path(scratch))
        decodes = _decodes(model, capacities, rewrites, Path(scratch))
    mib = 1 << 20
    print(f"{model}: .bin {bin_bytes / mib:.1f} MiB; decode rungs, NPU with NPUW_DEVICES=CPU")
    print(f"{'arm':<27}{'rungs':>6}{'store MiB':>11}{'peak RSS MiB':>14}{'per rung MiB':>14}")
    for run in runs:
        stored = (sum(run["blob_bytes"]) + run["shared_bytes"]) / mib
        peak = run["peak_rss_bytes"] / mib
        after = run["rss_after_rung_bytes"]
        steps = " ".join(f"{(b - a) / mib:.0f}" for a, b in itertools.pairwise(after)) or "-"
        print(f"{run['arm']:<27}{len(run['rungs']):>6}{stored:>11.1f}{peak:>14.0f}  {steps}")
    for arm in ARMS:
        one, many = (r for r in runs if r["arm"] == arm)
        ratio = many["peak_rss_bytes"] / one["peak_rss_bytes"]
        print(f"{arm}: {len(capacities)} rungs' peak RSS / one rung's = {ratio:.2f}")
    for arm in DECODE_ARMS:
        one, many = (d for d in decodes if d["arm"] == arm)
        peaks = [
            f"{g['peak_rss_bytes'] / mib:.0f}/{h['peak_rss_bytes'] / mib:.0f}"
            for g, h in zip(many["generations"], one["generations"], strict=True)
        ]
        print(f"{arm}: peak RSS MiB by generation, ladder/top rung alone: {' '.join(peaks)}")
    record = {
        "format": RESULTS_FORMAT,
        "command": shlex.join(["python", "tools/npu_weights.py", *sys.argv[1:]]),
        "model": model,
        "ladder": ladder,
        "rewrites": rewrites,
        "bin_bytes": bin_bytes,
        "properties": NPUW,
        "runs": runs,
        "decode_properties": DECODE_NPUW,
        "prompt_tokens": PROMPT_TOKENS,
        "decodes": decodes,
        "environment": dataclasses.asdict(environment(load_start)),
    }
    write_page(out, PAGE, record)


if __name__ == "__main__":
    main()
