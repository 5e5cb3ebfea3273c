"""The bench workflow: B0/B1/I1/I2/I3 side by side, in Williams order, one fresh process each.

Each repetition is a row of a Williams design; each run is a fresh interpreter
(``ovspec.bench.protocols.worker``) with a cold store (compile figures) or a prebuilt warm one.
The same prompt and forced tokens go through every protocol, so boundary logits can
be compared with the I1 control position by position. This module plans, runs and
aggregates; ``metrics`` computes per-run numbers, ``report`` and ``page`` render them
and ``common.plots`` draws them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.protocols.calibration import calibration_protocol, costs_from_run
from ovspec.bench.protocols.metrics import RunFigures, band_edges, median
from ovspec.bench.protocols.setups import CONTROL, DEFAULT_PROTOCOLS, SETUPS, Protocol
from ovspec.bench.protocols.worker import RunRequest
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError, OvspecError, TrialError
from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder
from ovspec.stats.orders import williams_orders
from ovspec.stats.paired import PairedSummary, summarize_pairs

VARIANTS = ("cold", "warm")


@dataclass(frozen=True)
class BenchConfig:
    model: ModelDir
    ladder: Ladder
    prompt_tokens: int
    new_tokens: int
    repetitions: int
    variants: tuple[str, ...]
    device: str
    properties: dict[str, str]
    prefill_chunk_tokens: int
    seed: int
    work_dir: Path
    protocols: tuple[Protocol, ...] = DEFAULT_PROTOCOLS
    # The device/host split (decode and compile on disjoint cores); None: shared cores.
    split: CoreSplit | None = None
    shared_too: bool = False  # with a split, also run every protocol on shared cores
    load_mode: str = "import"  # every protocol loads the same way (the split needs import)
    compression: str = "none"
    measure_floor: bool = True  # the stateful model's step per band (the sweep skips it)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise BadRequestError("--prompt-tokens must be at least 1")
        if self.new_tokens < 1:
            raise BadRequestError("--new-tokens must be at least 1")
        if self.prompt_tokens + self.new_tokens > self.ladder.top_tokens:
            raise BadRequestError(
                f"{self.prompt_tokens} prompt + {self.new_tokens} new tokens exceed the top rung "
                f"{self.ladder.top_tokens}; lower --new-tokens"
            )
        if self.repetitions < 1:
            raise BadRequestError("--repetitions must be at least 1")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise BadRequestError(f"--variants takes cold, warm or both (got {self.variants})")
        if CONTROL not in self.protocols:
            raise BadRequestError(f"the protocols must include the control {CONTROL.value}")
        self.ladder.check_fits(self.model.max_position_embeddings)

    @property
    def arms(self) -> list[tuple[str, str, CoreSplit | None]]:
        """(label, store variant, split) per arm: the label names the runs of one arm
        (``cold-split`` and ``cold-shared`` beside it; ``cold`` with no split)."""
        out: list[tuple[str, str, CoreSplit | None]] = []
        for variant in self.variants:
            out.append((f"{variant}-split" if self.split else variant, variant, self.split))
            if self.split is not None and self.shared_too:
                out.append((f"{variant}-shared", variant, None))
        return out

    @property
    def labels(self) -> list[str]:
        return [label for label, _, _ in self.arms]

    @property
    def logit_positions(self) -> tuple[int, ...]:
        """Live-token counts around each boundary (last step on a rung, first ones after)."""
        positions: set[int] = set()
        end = self.prompt_tokens + self.new_tokens
        for cap in list(self.ladder)[:-1]:
            positions.update(
                p for p in (cap - 1, cap, cap + 1, cap + 2) if self.prompt_tokens <= p <= end
            )
        return tuple(sorted(positions))


@dataclass
class RunOutcome:
    figures: RunFigures
    timeline: dict[str, Any]
    logits_path: Path


@dataclass
class BenchResult:
    config: BenchConfig
    runs: list[RunOutcome] = field(default_factory=list)
    memcpy_bytes_per_s: float = 0.0
    wall_s: float = 0.0
    # The measured floor: the dynamic stateful model's decode step (ms) at each band's
    # last live length, and every thread reading the weights once.
    floor_step_ms: dict[int, float] = field(default_factory=dict)
    weights_read_ms: float = 0.0
    # os.getloadavg() when the runs began and when they ended: the machine's other load.
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # arm label -> the auto arm's costs (AutoCosts JSON), from an untimed I1 run
    calibrations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def select(self, variant: str, protocol: Protocol) -> list[RunOutcome]:
        return sorted(
            (
                r
                for r in self.runs
                if r.figures.variant == variant and r.figures.protocol == protocol.value
            ),
            key=lambda r: r.figures.repetition,
        )


def measure_memcpy_bytes_per_s(size_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-N bandwidth of one large copy (bytes copied per second)."""
    src = np.ones(size_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - began)
    return size_bytes / best


def measure_floor(config: BenchConfig) -> tuple[dict[int, float], float]:
    """The floor each band is held to, measured rather than derived from a memcpy: the
    stateful model's step at the band's last live length, and a weights-only read."""
    from ovspec.bench.profile.rung import stateful_floor_ms, weights_read_ms

    lengths = [high - 1 for _, high in band_edges(config.ladder)]
    floor = stateful_floor_ms(config.model, lengths, config.device, config.properties, steps=5)
    return floor, weights_read_ms(config.model.bin_path)[1]


def make_tokens(config: BenchConfig) -> tuple[list[int], list[int]]:
    vocab = config.model.config.get("vocab_size")
    high = vocab if isinstance(vocab, int) and vocab > 10 else 1000
    rng = np.random.default_rng(config.seed)
    prompt = rng.integers(3, high, config.prompt_tokens).tolist()
    forced = rng.integers(3, high, config.new_tokens).tolist()
    return prompt, forced


def check_layouts(config: BenchConfig) -> None:
    """Refuse, before any run, a ladder the remap protocol (I3) cannot map."""
    from ovspec.ir.specialize import prepare, read_ir
    from ovspec.runtime import vmem
    from ovspec.runtime.kv import KVLayout
    from ovspec.runtime.kvremap import check_ladder

    remap = [p for p in config.protocols if SETUPS[p].kv_layout is KVLayout.REMAP]
    if remap and vmem.unsupported_reason() is None:  # elsewhere they fail over, and say so
        roles = prepare(read_ir(config.model.xml_path)).roles
        others = ",".join(p.value for p in config.protocols if p not in remap)
        check_ladder(roles, config.ladder, otherwise=f"--protocols {others}")


def run_bench(
    config: BenchConfig,
    on_run: Callable[[RunFigures], None] | None = None,
    run_worker: Callable[[Path], None] | None = None,
) -> BenchResult:
    """Every variant x repetition x protocol, each in a fresh worker process."""
    check_layouts(config)
    began = time.perf_counter()
    config.work_dir.mkdir(parents=True, exist_ok=True)
    worker = run_worker or _run_worker_process
    prompt, forced = make_tokens(config)
    result = BenchResult(config, memcpy_bytes_per_s=measure_memcpy_bytes_per_s())
    if config.measure_floor:
        result.floor_step_ms, result.weights_read_ms = measure_floor(config)
    result.load_before = os.getloadavg()
    orders = williams_orders(list(config.protocols), config.repetitions, config.seed)
    for variant in config.variants:
        arms = [(label, split) for label, v, split in config.arms if v == variant]
        warm_store = config.work_dir / "warm-store"
        if variant == "warm":
            # Prime: one untimed run per protocol and arm fills the store with every graph.
            for label, split in arms:
                for protocol in config.protocols:
                    _run_one(config, worker, label, -1, protocol, warm_store, prompt, forced, split)
        if Protocol.AUTO in config.protocols:
            for label, split in arms:
                store = warm_store
                if variant == "cold":
                    store = config.work_dir / f"calibration-{label}"
                calibrator = calibration_protocol(config.protocols)
                run = _run_one(config, worker, label, -2, calibrator, store, prompt, forced, split)
                if variant == "cold":
                    shutil.rmtree(store, ignore_errors=True)
                costs = costs_from_run(run.figures, config.ladder, config.prompt_tokens)
                result.calibrations[label] = costs.to_json()
        for repetition, order in enumerate(orders):
            # Split and shared arms alternate which goes first, repetition by repetition.
            for label, split in arms[:: 1 if repetition % 2 == 0 else -1]:
                for protocol in order:
                    store = warm_store
                    if variant == "cold":
                        store = config.work_dir / f"cold-{repetition}-{label}-{protocol.value}"
                    costs_json = (
                        result.calibrations.get(label) if protocol is Protocol.AUTO else None
                    )
                    outcome = _run_one(
                        config,
                        worker,
                        label,
                        repetition,
                        protocol,
                        store,
                        prompt,
                        forced,
                        split,
                        costs_json,
                    )
                    if variant == "cold":
                        shutil.rmtree(store, ignore_errors=True)
                    result.runs.append(outcome)
                    if on_run is not None:
                        on_run(outcome.figures)
        shutil.rmtree(warm_store, ignore_errors=True)
    result.wall_s = time.perf_counter() - began
    result.load_after = os.getloadavg()
    return result


def _run_one(
    config: BenchConfig,
    worker: Callable[[Path], None],
    variant: str,
    repetition: int,
    protocol: Protocol,
    store: Path,
    prompt: list[int],
    forced: list[int],
    split: CoreSplit | None = None,
    auto_costs: dict[str, Any] | None = None,
) -> RunOutcome:
    stem = config.work_dir / f"{variant}-r{repetition}-{protocol.value}"
    request = RunRequest(
        model_dir=str(config.model.root),
        ladder=str(config.ladder),
        protocol=protocol.value,
        variant=variant,
        repetition=repetition,
        prompt_ids=tuple(prompt),
        forced_ids=tuple(forced),
        logit_positions=config.logit_positions,
        device=config.device,
        properties=config.properties,
        store_dir=str(store),
        prefill_chunk_tokens=config.prefill_chunk_tokens,
        out_json=str(stem.with_suffix(".json")),
        out_logits=str(stem.with_suffix(".npz")),
        split=split.to_json() if split is not None else None,
        load_mode=config.load_mode,
        compression=config.compression,
        auto_costs=auto_costs,
    )
    request_path = stem.with_suffix(".request.json")
    request_path.write_text(json.dumps(request.to_json()))
    worker(request_path)
    document = json.loads(stem.with_suffix(".json").read_text())
    if "error" in document:
        raise OvspecError(f"{protocol.value} run {repetition} failed: {document['error']}")
    return RunOutcome(
        RunFigures.from_json(document["figures"]), document["timeline"], stem.with_suffix(".npz")
    )


def _run_worker_process(request_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "ovspec.bench.protocols.worker", str(request_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    out = request_path.with_name(request_path.name.replace(".request.json", ".json"))
    if completed.returncode != 0 and not out.exists():
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        raise OvspecError(f"bench worker crashed (exit {completed.returncode}): {tail[0]}")


# -- aggregation ------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    protocol: str
    variant: str
    compared: int
    top1_equal: int
    min_cosine: float


def boundary_logits(result: BenchResult, variant: str, protocol: Protocol) -> list[dict[str, Any]]:
    """Per boundary position of every run of ``protocol``: whether its top-1 equals the
    control's of the same repetition, and the cosine of the two logits vectors."""
    out: list[dict[str, Any]] = []
    controls = {r.figures.repetition: r for r in result.select(variant, CONTROL)}
    for run in result.select(variant, protocol):
        control = controls.get(run.figures.repetition)
        if control is None:
            continue
        with np.load(run.logits_path) as mine, np.load(control.logits_path) as theirs:
            index = {int(p): i for i, p in enumerate(theirs["positions"])}
            for i, pos in enumerate(mine["positions"]):
                j = index.get(int(pos))
                if j is None:
                    continue
                a, b = mine["logits"][i], theirs["logits"][j]
                cos = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
                out.append(
                    {
                        "repetition": run.figures.repetition,
                        "position": int(pos),
                        "top1_equal": bool(np.argmax(a) == np.argmax(b)),
                        "cosine": cos,
                    }
                )
    return out


def boundary_agreement(result: BenchResult, variant: str, protocol: Protocol) -> Agreement:
    """Top-1 and cosine of ``protocol``'s boundary logits against the control's."""
    rows = boundary_logits(result, variant, protocol)
    return Agreement(
        protocol.value,
        variant,
        len(rows),
        sum(r["top1_equal"] for r in rows),
        min((r["cosine"] for r in rows), default=1.0),
    )


PAIRED_FIGURES = ("foreground_s", "critical_path_s", "decode_s")


def paired_vs_control(
    result: BenchResult, variant: str, protocol: Protocol, figure: str
) -> PairedSummary | str:
    """Paired over repetitions: control (A) vs ``protocol`` (B). A string says why not."""
    control = {r.figures.repetition: r.figures for r in result.select(variant, CONTROL)}
    pairs = [
        (getattr(control[r.figures.repetition], figure), getattr(r.figures, figure))
        for r in result.select(variant, protocol)
        if r.figures.repetition in control
    ]
    if len(pairs) < 2:
        return f"n/a: {len(pairs)} pair(s); run --repetitions 2 or more"
    try:
        return summarize_pairs([a for a, _ in pairs], [b for _, b in pairs], unit="s")
    except TrialError as exc:
        return f"n/a: {exc}"


@dataclass(frozen=True)
class BandComparison:
    band: str
    capacity_tokens: int
    b0_step_ms: float
    step_ms: float
    measured_speedup: float
    predicted_speedup: float  # (weights + B0 KV) / (weights + rung KV)
    floor_step_ms: float  # measured: the stateful model's step at the band's last length

    @property
    def fraction_of_predicted(self) -> float:
        return (
            (self.measured_speedup - 1) / (self.predicted_speedup - 1)
            if (self.predicted_speedup > 1)
            else float("nan")
        )


def band_comparison(result: BenchResult, variant: str, protocol: Protocol) -> list[BandComparison]:
    """Per band: speed-up over B0, measured vs what bytes moved predict."""
    base = result.select(variant, Protocol.B0)
    runs = result.select(variant, protocol)
    if not base or not runs:
        return []
    sample = runs[0].figures
    weights = sample.weights_bytes
    top_kv = sample.kv_bytes_per_token * result.config.ladder.top_tokens
    out = []
    for index, (low, high) in enumerate(band_edges(result.config.ladder)):
        b0_ms = median(
            [r.figures.bands[index].step_ms for r in base if r.figures.bands[index].steps]
        )
        ms = median([r.figures.bands[index].step_ms for r in runs if r.figures.bands[index].steps])
        if not (b0_ms > 0 and ms > 0):
            continue
        rung_kv = sample.kv_bytes_per_token * high
        out.append(
            BandComparison(
                band=f"{low}-{high}",
                capacity_tokens=high,
                b0_step_ms=b0_ms,
                step_ms=ms,
                measured_speedup=b0_ms / ms,
                predicted_speedup=(weights + top_kv) / (weights + rung_kv),
                floor_step_ms=result.floor_step_ms.get(high - 1, float("nan")),
            )
        )
    return out


def medians(runs: Sequence[RunOutcome], name: str) -> float:
    return median([float(getattr(r.figures, name)) for r in runs])
