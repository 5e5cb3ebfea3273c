"""One serving benchmark run: the model resolved once, the trace drawn once, then each
repetition runs every arm in a rotated order, each in a fresh process: ``ovspec serve``
at batch 1 and batched (driven over HTTP by the openai client) and genai's
``ContinuousBatchingPipeline`` (driven in its own process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.serve.client import Endpoint, drive
from ovspec.bench.serve.trace import TraceRequest, TraceSpec
from ovspec.errors import BadRequestError
from ovspec.ir.model_dir import resolve_model
from ovspec.ladder import Ladder
from ovspec.store.local import Store

PAGE = "serve"
BATCH_1, BATCHED, GENAI = "ovspec-batch-1", "ovspec-batched", "genai-cb"
ARMS = (BATCH_1, BATCHED, GENAI)
CHECKOUT = Path(__file__).resolve().parents[3]
START_S = 900.0  # a bound on a server's start (compiling the graph), not a measurement


def run_serve(
    model: str,
    work_dir: Path,
    spec: TraceSpec,
    clients: int,
    ladder: Ladder,
    repetitions: int,
    genai_cache_gb: int = 1,
    on_progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """The results document: the setup, the raw samples of every arm and repetition,
    the environment."""
    if clients < 2 or repetitions < 1:
        raise BadRequestError("the serving benchmark needs --clients >= 2, --repetitions >= 1")
    load_start = load_average()
    store = Store(work_dir / "store")
    try:
        model_dir = resolve_model(model, store.models_folder)
    finally:
        store.close()
    vocab = int(json.loads((model_dir.root / "config.json").read_text())["vocab_size"])
    trace = spec.draw(vocab)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(repetitions):
        for arm in ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]:
            on_progress(f"repetition {rep + 1}/{repetitions}: {arm}")
            if arm == GENAI:
                runs[arm].append(_genai(model_dir.root, trace, clients, genai_cache_gb))
            else:
                batch = 1 if arm == BATCH_1 else clients
                runs[arm].append(_ovspec(model_dir.root, work_dir, trace, clients, batch, ladder))
    return {
        "page": PAGE,
        "model": model,
        "ladder": str(ladder),
        "clients": clients,
        "trace": asdict(spec),
        "runs": runs,
        "environment": asdict(environment(load_start)),
    }


def _ovspec(
    model_dir: Path,
    work_dir: Path,
    trace: tuple[TraceRequest, ...],
    clients: int,
    max_sequences: int,
    ladder: Ladder,
) -> dict[str, Any]:
    command = [sys.executable, "-c", "from ovspec.cli import main; main()", "serve"]
    command += [str(model_dir), "--port", "0", "--json", "--ladder", str(ladder)]
    command += ["--max-sequences", str(max_sequences), "--max-queue", str(len(trace) + 1)]
    command += ["--cache-dir", str(work_dir / "store"), "--served-model-name", "bench"]
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    env.pop("OVSPEC_API_KEY", None)
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line:
            raise BadRequestError(f"ovspec serve did not start: {' '.join(command)}")
        endpoint = Endpoint(json.loads(line)["url"], "bench")
        drive(endpoint, trace[:1], 1)  # warm: the first call's one-off costs stay out
        record = drive(endpoint, trace, clients)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(START_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    record["max_sequences"] = max_sequences
    return record


def _genai(
    model_dir: Path, trace: tuple[TraceRequest, ...], clients: int, cache_gb: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "genai.json"
        job = {
            "model_dir": str(model_dir),
            "trace": [asdict(r) for r in trace],
            "clients": clients,
            "cache_gb": cache_gb,
            "out": str(out),
        }
        env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
        subprocess.run(
            [sys.executable, "-m", "ovspec.bench.serve.genai_child"],
            input=json.dumps(job),
            text=True,
            env=env,
            check=True,
            timeout=START_S * 4,
        )
        record: dict[str, Any] = json.loads(out.read_text())
    record["max_sequences"] = clients
    return record
