"""The KV-layout benchmark: what a boundary costs and what the KV holds, remap against
copy-and-grow with and without pre-fault, side by side in one process.

Two parts. ``run_boundaries`` grows a cache shaped like the model's KV across a ladder
of boundaries, the arms in rotated order per repetition, next to a memcpy of the same
bytes into touched pages (the bandwidth a copy could reach). ``run_decode`` decodes one
token sequence through the real graphs with every arm at once, in lockstep: at each
token the arms step in a Williams order, so load drift hits them alike and per-band
step times pair up token by token. Figures only; nothing here asserts on time.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from ovspec.errors import BadRequestError, TrialError
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import prefill_specialization
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kv import CopyAndGrowKV, KVCache, KVLayout, Prefault, choose_layout, make_kv
from ovspec.runtime.kvcache import seq_slice
from ovspec.stats.orders import williams_orders
from ovspec.stats.paired import summarize_pairs

REMAP = "remap"
COPY = "copy-and-grow"
PREFAULT = "copy-and-grow + pre-fault"
DIRECT = "direct (B0)"
MEMCPY = "memcpy"
GROW_ARMS = (REMAP, COPY, PREFAULT)
DECODE_ARMS = (DIRECT, COPY, PREFAULT, REMAP)


def check_remap_ladder(roles: ModelRoles, ladder: Ladder) -> None:
    """The ladders here must be ones remap can map (one line otherwise)."""
    if vmem.unsupported_reason() is not None:
        raise BadRequestError(
            f"the KV benchmark compares the remap layout, which cannot run here: "
            f"{vmem.unsupported_reason()}"
        )
    choose_layout(KVLayout.REMAP, roles, ladder)


# --------------------------------------------------------------------------- boundaries


@dataclass(frozen=True)
class BoundarySample:
    arm: str
    from_tokens: int
    to_tokens: int
    live_bytes: int
    seconds: float  # the whole grow() call (memcpy: the copy)
    copy_seconds: float  # Migration.copy_seconds: allocate/wait + copy (not the free)
    copied_bytes: int
    moved_bytes: int
    peak_physical_bytes: int | None  # only in the one untimed sample that measures it
    prefault_seconds: float  # on the pre-fault thread, before the boundary
    timed: bool = True  # False: the sample that read pagemap inside grow()


def _fill(kv: KVCache, tokens: int, pattern: np.ndarray) -> None:
    """Make ``tokens`` live as decoding leaves them: written in place, page by page."""
    for role in kv.roles.kv:
        view = kv.arrays()[role.past_input][seq_slice(role, 0, tokens)]
        view[...] = pattern.reshape(-1)[: view.size].reshape(view.shape)
    kv.live_tokens = tokens


def _grow_sample(
    arm: str, roles: ModelRoles, low: int, high: int, pattern: np.ndarray, measure: bool = False
) -> BoundarySample:
    layout = KVLayout.REMAP if arm == REMAP else KVLayout.COPY_AND_GROW
    kv = make_kv(layout, roles, low, high)
    kv.measure_physical = measure
    try:
        _fill(kv, low, pattern)
        prefault_s = 0.0
        if arm == PREFAULT:
            assert isinstance(kv, CopyAndGrowKV)
            kv.start_prefault(high)
            kv.wait_prefault()  # as at a boundary reached after an ample lead
            prefault_s = kv.prefaults[-1].seconds
        began = time.perf_counter()
        migration = kv.grow(high)
        seconds = time.perf_counter() - began
    finally:
        kv.close()
    return BoundarySample(
        arm,
        low,
        high,
        roles.kv_bytes_per_token * low,
        seconds,
        migration.copy_seconds or migration.seconds,
        migration.copied_bytes,
        migration.moved_bytes,
        migration.peak_physical_bytes,
        prefault_s,
        timed=not measure,
    )


def _memcpy_sample(source: np.ndarray, low: int, high: int) -> BoundarySample:
    """A flat copy of the live bytes into pages already committed: memcpy speed."""
    live_bytes = source.nbytes
    region = vmem.Region(live_bytes)
    target = region.array(0, [live_bytes], np.dtype(np.uint8))
    vmem.populate_write([region.span])
    began = time.perf_counter()
    np.copyto(target, source)
    seconds = time.perf_counter() - began
    return BoundarySample(MEMCPY, low, high, live_bytes, seconds, seconds, live_bytes, 0, None, 0)


def run_boundaries(
    roles: ModelRoles, ladder: Ladder, repetitions: int, say: Callable[[str], None] = print
) -> list[BoundarySample]:
    """Every boundary of ``ladder`` x every arm x ``repetitions``, arms in rotated order."""
    check_remap_ladder(roles, ladder)
    longest = max(math.prod(r.shape(1, ladder.top_tokens)) for r in roles.kv)
    pattern = np.random.default_rng(0).standard_normal(longest).astype(np.float32)
    arms = (*GROW_ARMS, MEMCPY)
    samples: list[BoundarySample] = []
    for low, high in itertools.pairwise(ladder):
        say(f"boundary {low} -> {high}: {repetitions} x {len(arms)} arms")
        source = np.random.default_rng(low).integers(
            0, 255, roles.kv_bytes_per_token * low, np.uint8
        )
        for arm in GROW_ARMS:  # the physical peak, from one untimed sample each
            samples.append(_grow_sample(arm, roles, low, high, pattern, measure=True))
        for rep in range(repetitions):
            order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
            for arm in order:
                if arm == MEMCPY:
                    samples.append(_memcpy_sample(source, low, high))
                else:
                    samples.append(_grow_sample(arm, roles, low, high, pattern))
    return samples


# --------------------------------------------------------------------------- decode


@dataclass
class ArmTrace:
    """One arm of the lockstep decode: its own timeline (seconds of its own steps)."""

    arm: str
    kv_bytes_top: int  # what the direct graph reserves from the start
    clock_s: float = 0.0
    samples: list[tuple[float, int, int, int | None]] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)  # per decode step, boundary included
    step_seconds: list[float] = field(default_factory=list)  # the same, boundary excluded
    step_live: list[int] = field(default_factory=list)
    step_infer_s: list[float] = field(default_factory=list)
    boundaries: list[dict[str, Any]] = field(default_factory=list)

    def figures(self, clock: Sequence[float]) -> dict[str, Any]:
        """Token- and time-weighted KV. Time uses the run's common clock (the median
        step of all arms at each token, boundaries excluded), so arms differ by what they
        hold, not by their step-time noise; each boundary adds its own interval (the
        migration's seconds) holding its peak, which is where copy-and-grow holds the old
        and new buffers at once."""
        physical = [s[3] for s in self.samples[1:]]
        reserved = [s[2] for s in self.samples[1:]]
        spans = [b["migration_s"] for b in self.boundaries]
        weights = [*clock, *spans]
        known = [p for p in physical if p is not None]
        peak_reserved = [b["peak_reserved_bytes"] for b in self.boundaries]
        out: dict[str, Any] = {
            "reserved_token_weighted_bytes": float(np.mean(reserved)),
            "reserved_time_weighted_bytes": float(
                np.average([*reserved, *peak_reserved], weights=weights)
            ),
            "reserved_peak_bytes": max([s[2] for s in self.samples] + peak_reserved),
        }
        peaks = [b["peak_physical_bytes"] for b in self.boundaries]
        if len(known) == len(physical) and None not in peaks:
            out |= {
                "physical_token_weighted_bytes": float(np.mean(known)),
                "physical_time_weighted_bytes": float(
                    np.average([*known, *peaks], weights=weights)
                ),
                "physical_peak_bytes": max([int(s[3] or 0) for s in self.samples] + peaks),
            }
        return out


@dataclass(frozen=True)
class DecodeConfig:
    model: Path
    ladder: Ladder
    prompt_tokens: int
    prefill_chunk_tokens: int
    properties: dict[str, str]
    store: Path
    seed: int
    prefault_lead_tokens: int = 16
    arms: tuple[str, ...] = DECODE_ARMS

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_tokens < self.ladder.top_tokens:
            raise BadRequestError(
                f"--prompt-tokens must be in [1, {self.ladder.top_tokens}), "
                f"got {self.prompt_tokens}"
            )
        unknown = [a for a in self.arms if a not in DECODE_ARMS]
        if unknown or COPY not in self.arms or REMAP not in self.arms:
            raise BadRequestError(
                f"decode arms come from {', '.join(DECODE_ARMS)} and include {COPY} and {REMAP}"
            )


@dataclass
class DecodeRun:
    config: DecodeConfig
    traces: dict[str, ArmTrace]
    clock: list[float]  # per token: the median step of the arms, boundaries excluded
    agreement: dict[str, dict[str, Any]]  # arm -> vs copy-and-grow, every step and boundaries
    kv_bytes_per_token: int
    weights_bytes: int
    wall_s: float


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.dot(a64, b64) / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def run_decode(config: DecodeConfig, say: Callable[[str], None] = print) -> DecodeRun:
    """All arms decode the same tokens, stepping in lockstep (Williams order per token)."""
    import ovspec.runtime.decoding as runtime
    from ovspec.runtime.session import DecodeSession

    began = time.perf_counter()
    ladder, top = config.ladder, config.ladder.top_tokens
    with (
        runtime.open(
            config.model,
            ladder=ladder,
            properties=config.properties,
            store=config.store,
            # One ahead, passed rungs released below: a compiled model holds its own
            # weights, and every rung at once (eager) ran a 0.5B model out of memory.
            policy="one_ahead",
            prefill_chunk_tokens=config.prefill_chunk_tokens,
        ) as loader,
        runtime.open(
            config.model,
            ladder=Ladder((top,)),
            properties=config.properties,
            store=config.store,
            policy="eager",
            prefill_chunk_tokens=config.prefill_chunk_tokens,
        ) as direct_loader,
    ):
        roles = loader.compiler.llm().roles
        check_remap_ladder(roles, ladder)
        vocab = loader.compiler.model_dir.config.get("vocab_size")
        rng = np.random.default_rng(config.seed)
        high = vocab if isinstance(vocab, int) and vocab > 10 else 1000
        prompt = rng.integers(3, high, config.prompt_tokens).tolist()
        forced = rng.integers(3, high, top - config.prompt_tokens).tolist()
        first = ladder.rung_for(len(prompt))
        say(f"compiling or loading the graphs of {ladder} and {top} (direct)")
        loader.start(first)
        if DIRECT in config.arms:
            direct_loader.start(top)
        sessions: dict[str, DecodeSession] = {}
        kvs: dict[str, KVCache] = {}
        for arm in config.arms:
            if arm == DIRECT:
                kvs[arm] = make_kv(KVLayout.COPY_AND_GROW, roles, top, top)
                programs, arm_ladder = direct_loader, Ladder((top,))
            else:
                layout = KVLayout.REMAP if arm == REMAP else KVLayout.COPY_AND_GROW
                prefault = (
                    Prefault(ladder, config.prefault_lead_tokens) if arm == PREFAULT else None
                )
                kvs[arm] = make_kv(layout, roles, first, top, prefault)
                programs, arm_ladder = loader, ladder
            kvs[arm].measure_physical = True  # boundary peaks too
            sessions[arm] = DecodeSession(
                roles, arm_ladder, kvs[arm], programs, config.prefill_chunk_tokens
            )
        traces = {a: ArmTrace(a, roles.kv_bytes_per_token * top) for a in config.arms}
        compare = [a for a in config.arms if a != COPY]
        agreement: dict[str, dict[str, Any]] = {
            a: {"steps": 0, "top1_equal": 0, "min_cosine": 1.0, "boundary_steps": 0,
                "boundary_top1_equal": 0, "boundary_min_cosine": 1.0}
            for a in compare
        }  # fmt: skip
        boundary_live = {c + d for c in list(ladder)[:-1] for d in (-1, 0, 1, 2)}
        try:
            logits = {a: sessions[a].prefill(prompt) for a in config.arms}
            loader.release(prefill_specialization(first, config.prefill_chunk_tokens))
            direct_loader.release(prefill_specialization(top, config.prefill_chunk_tokens))
            for arm in config.arms:
                _sample(traces[arm], kvs[arm])
            on_ladder = [a for a in config.arms if a != DIRECT]
            passed = [c for c in ladder if c < first]
            orders = williams_orders(list(config.arms), len(forced), config.seed)
            say(f"decoding {len(forced)} tokens x {len(config.arms)} arms in lockstep")
            for index, token in enumerate(forced):
                for arm in orders[index]:
                    _timed_step(traces[arm], sessions[arm], kvs[arm], token, logits)
                _agree(agreement, logits, kvs[COPY].live_tokens in boundary_live)
                lowest = min(kvs[a].capacity_tokens for a in on_ladder)
                for rung in (c for c in ladder if c < lowest and c not in passed):
                    loader.release(rung)  # every ladder arm has left it
                    passed.append(rung)
                if (index + 1) % 256 == 0:
                    rss = psutil.Process().memory_info().rss
                    say(f"  {index + 1}/{len(forced)} tokens; RSS {rss / 2**30:.1f} GiB")
        finally:
            for arm in config.arms:
                sessions[arm].close()
                kvs[arm].close()
        weights_bytes = loader.compiler.model_dir.bin_path.stat().st_size
    clock = [
        float(np.median([t.step_seconds[i] for t in traces.values()])) for i in range(len(forced))
    ]
    return DecodeRun(
        config,
        traces,
        clock,
        agreement,
        roles.kv_bytes_per_token,
        weights_bytes,
        time.perf_counter() - began,
    )


def _sample(trace: ArmTrace, kv: KVCache) -> None:
    trace.samples.append((trace.clock_s, kv.live_tokens, kv.reserved_bytes, kv.physical_bytes()))


def _timed_step(
    trace: ArmTrace, session: Any, kv: KVCache, token: int, logits: dict[str, np.ndarray]
) -> None:
    crossings = len(session.boundaries)
    began = time.perf_counter()
    logits[trace.arm] = session.step(token)
    duration = time.perf_counter() - began
    boundary_s = 0.0
    if len(session.boundaries) > crossings:
        b = session.boundaries[-1]
        m = b.migration
        trace.boundaries.append(
            {
                "at_live_tokens": b.at_live_tokens,
                "began_s": trace.clock_s,
                "from": m.from_capacity_tokens,
                "to": m.to_capacity_tokens,
                "migration_s": m.seconds,
                "copied_bytes": m.copied_bytes,
                "moved_bytes": m.moved_bytes,
                "allocated_bytes": m.allocated_bytes,
                "peak_reserved_bytes": m.peak_reserved_bytes,
                "peak_physical_bytes": m.peak_physical_bytes,
                "program_wait_s": b.program_wait_s,
            }
        )
        boundary_s = m.seconds
    trace.clock_s += duration
    trace.durations.append(duration)
    trace.step_seconds.append(duration - boundary_s)
    step = session.steps[-1]
    trace.step_live.append(step.live_tokens)
    trace.step_infer_s.append(step.infer_s)
    _sample(trace, kv)


def _agree(agreement: dict[str, dict[str, Any]], logits: dict[str, np.ndarray], near: bool) -> None:
    control = logits[COPY]
    top1 = int(np.argmax(control))
    for arm, row in agreement.items():
        same = int(int(np.argmax(logits[arm])) == top1)
        cosine = _cosine(logits[arm], control)
        row["steps"] += 1
        row["top1_equal"] += same
        row["min_cosine"] = min(row["min_cosine"], cosine)
        if near:
            row["boundary_steps"] += 1
            row["boundary_top1_equal"] += same
            row["boundary_min_cosine"] = min(row["boundary_min_cosine"], cosine)


@dataclass(frozen=True)
class BandComparison:
    band: str
    steps: int
    copy_step_ms: float
    arm_step_ms: float
    relative_change: float  # (arm - copy) / copy of the mean step
    ci_low: float  # 95% CI of that relative change (paired t over tokens)
    ci_high: float
    arm_faster_steps: int


def compare_bands(run: DecodeRun, arm: str) -> list[BandComparison]:
    """Per band, the arm's decode steps against copy-and-grow's at the same tokens."""
    copy, other = run.traces[COPY], run.traces[arm]
    edges = [0, *run.config.ladder]
    rows = []
    for low, high in itertools.pairwise(edges):
        index = [i for i, live in enumerate(copy.step_live) if low <= live < high]
        if len(index) < 2:
            continue
        a = [copy.step_infer_s[i] for i in index]
        b = [other.step_infer_s[i] for i in index]
        try:
            summary = summarize_pairs(a, b, unit="s")
        except TrialError:
            continue
        mean_a = summary.mean_a
        rows.append(
            BandComparison(
                f"{low}-{high}",
                len(index),
                1000 * mean_a,
                1000 * summary.mean_b,
                summary.relative_change,
                summary.t_test.ci_low / mean_a,
                summary.t_test.ci_high / mean_a,
                summary.b_faster_pairs,
            )
        )
    return rows


def summarize_boundaries(samples: Sequence[BoundarySample]) -> list[dict[str, Any]]:
    """Median (and min-max) per boundary and arm."""
    rows = []
    keys = sorted({(s.from_tokens, s.to_tokens) for s in samples})
    for low, high in keys:
        for arm in (*GROW_ARMS, MEMCPY):
            every = [s for s in samples if (s.from_tokens, s.to_tokens, s.arm) == (low, high, arm)]
            mine = [s for s in every if s.timed]
            if not mine:
                continue
            seconds = [s.seconds for s in mine]
            copy_s = float(np.median([s.copy_seconds for s in mine]))
            copied = mine[0].copied_bytes
            peaks = [s.peak_physical_bytes for s in every if s.peak_physical_bytes is not None]
            rows.append(
                {
                    "from": low,
                    "to": high,
                    "arm": arm,
                    "live_bytes": mine[0].live_bytes,
                    "n": len(mine),
                    "median_s": float(np.median(seconds)),
                    "min_s": min(seconds),
                    "max_s": max(seconds),
                    "copy_median_s": copy_s,
                    "copied_bytes": copied,
                    "moved_bytes": mine[0].moved_bytes,
                    "copy_bytes_per_s": copied / copy_s if copied and copy_s > 0 else None,
                    "peak_physical_bytes": max(peaks) if peaks else None,
                    "prefault_median_s": float(np.median([s.prefault_seconds for s in mine])),
                }
            )
    return rows
