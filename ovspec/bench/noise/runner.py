"""Runs the noise-floor probe: fresh processes one after another, each stepping the same
static decode graph on the same core, and the results document (every step's seconds)
``page`` renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ovspec.bench.noise.probe import ProbeRequest
from ovspec.errors import OvspecError

# History: 1 — first format (2026-12).
RESULTS_FORMAT = 1
# numpy's BLAS on one thread: the control measures one core, as the decode does.
ONE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_processes(
    request: ProbeRequest,
    processes: int,
    work_dir: Path,
    on_process: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """``processes`` fresh probe processes in turn; each one's samples."""
    work_dir.mkdir(parents=True, exist_ok=True)
    out: list[dict[str, Any]] = []
    for index in range(processes):
        if on_process is not None:
            on_process(index, processes)
        path = work_dir / f"probe-{index}.json"
        path.write_text(json.dumps(request.to_json()))
        completed = subprocess.run(
            [sys.executable, "-m", "ovspec.bench.noise.probe", str(path)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **ONE_THREAD_ENV},
        )
        result_path = path.with_suffix(".out.json")
        if completed.returncode != 0 or not result_path.is_file():
            tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["?"]
            raise OvspecError(
                f"noise probe {index} failed (exit {completed.returncode}): {tail[0]}"
            )
        out.append({"index": index, **json.loads(result_path.read_text())})
    return out


def results_document(
    request: ProbeRequest,
    runs: list[dict[str, Any]],
    *,
    model: str,
    command: str,
    environment: Mapping[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    return {
        "format": RESULTS_FORMAT,
        "command": command,
        "model": model,
        "request": {k: v for k, v in request.to_json().items() if k != "model_dir"},
        "environment": dict(environment),
        "wall_s": wall_s,
        "processes": runs,
    }
