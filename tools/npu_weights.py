#!/usr/bin/env python3
"""How often the NPU path (NPUW on CPU subdevices) holds a model's weights: for a ladder
of rungs against its top rung alone, per blob mode, the store's blob bytes and the peak
RSS of a fresh process that imports every rung's decode graph and runs each once.
Prints the figures; raw samples go to JSON:

    python tools/npu_weights.py                                   # builtin:small
    python tools/npu_weights.py --model builtin:qwen2.5-0.5b --out /tmp/w.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import resolve_model

NPUW = {"NPUW_DEVICES": "CPU", "NPUW_F16IC": "NO", "INFERENCE_PRECISION_HINT": "f32"}

# One fresh process: ``build`` compiles the rungs into the store; ``import`` imports
# them through one compiler, as a loader does, runs each once and reports its memory.
_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ovspec.compile.compiler import Compiler
from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.specialize import Specialization
from ovspec.store.local import Store

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

root, model, store, mode, properties, capacities, action = sys.argv[1:]
compiler = Compiler(ModelDir.open(model), "NPU", json.loads(properties), Store(Path(store)),
                    blob_mode=BlobMode(mode))
if action == "build":
    sizes = [compiler.build(Specialization.decode(c)).blob_bytes for c in json.loads(capacities)]
    print(json.dumps({"blob_bytes": sizes}))
    sys.exit(0)
programs, rss = [], []
for capacity in json.loads(capacities):
    programs.append(compiler.load(Specialization.decode(capacity)))
    programs[-1].compiled.create_infer_request().infer()
    rss.append(status("VmRSS"))
print(json.dumps({"rss_after_rung_bytes": rss, "peak_rss_bytes": status("VmHWM")}))
"""


def _child(args: list[str]) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, root, *args], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:small", show_default=True)
@click.option("--ladder", default="64,128,256,512", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(model: str, ladder: str, out: Path | None) -> None:
    capacities = [int(c) for c in ladder.split(",")]
    with tempfile.TemporaryDirectory(prefix="npu-weights-") as scratch:
        model_dir = resolve_model(model, Path(scratch) / "models")
        bin_bytes = model_dir.bin_path.stat().st_size
        runs: list[dict[str, Any]] = []
        for mode in BlobMode:
            for rungs in (capacities[-1:], capacities):
                store = Path(scratch) / f"{mode.value}-{len(rungs)}"
                args = [str(model_dir.root), str(store), mode.value, json.dumps(NPUW)]
                built = _child([*args, json.dumps(rungs), "build"])
                imported = _child([*args, json.dumps(rungs), "import"])
                runs.append({"blob_mode": mode.value, "rungs": rungs, **built, **imported})
    mib = 1 << 20
    print(f"{model}: .bin {bin_bytes / mib:.1f} MiB; decode rungs, NPU with NPUW_DEVICES=CPU")
    print(f"{'blob mode':<11}{'rungs':>6}{'store MiB':>11}{'peak RSS MiB':>14}")
    for run in runs:
        stored, peak = sum(run["blob_bytes"]) / mib, run["peak_rss_bytes"] / mib
        print(f"{run['blob_mode']:<11}{len(run['rungs']):>6}{stored:>11.1f}{peak:>14.0f}")
    for mode in BlobMode:
        one, many = (r for r in runs if r["blob_mode"] == mode.value)
        ratio = many["peak_rss_bytes"] / one["peak_rss_bytes"]
        print(f"{mode.value}: {len(capacities)} rungs' peak RSS / one rung's = {ratio:.2f}")
    if out is not None:
        record = {"model": model, "bin_bytes": bin_bytes, "properties": NPUW, "runs": runs}
        out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
