"""The KV benchmark's decode part: every layout decodes one token sequence through the
real graphs, in lockstep (at each token the arms step in a Williams order, so load drift
hits them alike and per-band step times pair up token by token), recording what each
layout's KV holds over time. Extra passes repeat copy-and-grow against remap alone, with
every successor loaded before its rung's first timed step, to narrow the band comparison.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.kv.boundaries import (
    COPY,
    DECODE_ARMS,
    DIRECT,
    PREFAULT,
    REMAP,
    check_remap_ladder,
)
from ovspec.errors import BadRequestError, TrialError
from ovspec.extras import require_extra
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import prefill_specialization
from ovspec.ladder import Ladder
from ovspec.runtime.kv import KVCache, KVLayout, Prefault, make_kv
from ovspec.runtime.loader import Loader
from ovspec.stats.orders import williams_orders
from ovspec.stats.paired import summarize_pairs


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
    passes: int = 1  # the first with every arm; the others copy-and-grow against remap

    def __post_init__(self) -> None:
        if self.passes < 1:
            raise BadRequestError(f"--decode-passes must be at least 1, got {self.passes}")
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
    # Passes after the first: copy-and-grow and remap only, every graph loaded before
    # its rung's first timed step. Their steps join the band comparison, nothing else.
    speed_traces: list[dict[str, ArmTrace]] = field(default_factory=list)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.dot(a64, b64) / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def run_decode(config: DecodeConfig, say: Callable[[str], None] = print) -> DecodeRun:
    """All arms decode the same tokens, stepping in lockstep (Williams order per token);
    then ``config.passes - 1`` passes of copy-and-grow against remap alone."""
    import ovspec.runtime.decoding as runtime

    require_extra("bench", "the KV benchmark's decode")
    began = time.perf_counter()
    ladder, top = config.ladder, config.ladder.top_tokens
    with (
        runtime.open_rungs(
            config.model,
            ladder=ladder,
            properties=config.properties,
            store=config.store,
            # One ahead, passed rungs released below: a compiled model holds its own
            # weights, and every rung at once (eager) ran a 0.5B model out of memory.
            policy="one_ahead",
            prefill_chunk_tokens=config.prefill_chunk_tokens,
        ) as loader,
        runtime.open_rungs(
            config.model,
            ladder=Ladder((top,)),
            properties=config.properties,
            store=config.store,
            policy="eager",
            prefill_chunk_tokens=config.prefill_chunk_tokens,
        ) as direct_loader,
    ):
        roles = loader.roles()
        check_remap_ladder(roles, ladder)
        vocab = loader.model_dir.config.get("vocab_size")
        rng = np.random.default_rng(config.seed)
        high = vocab if isinstance(vocab, int) and vocab > 10 else 1000
        prompt = rng.integers(3, high, config.prompt_tokens).tolist()
        forced = rng.integers(3, high, top - config.prompt_tokens).tolist()
        first = ladder.rung_for(len(prompt))
        say(f"compiling or loading the graphs of {ladder} and {top} (direct)")
        loader.start(first)
        if DIRECT in config.arms:
            direct_loader.start(top)
        lockstep = _Lockstep(config, roles, loader, direct_loader, prompt, forced, first)
        traces, agreement = lockstep.run(config.arms, say, drain=False)
        speed_traces = []
        for number in range(2, config.passes + 1):
            say(f"speed pass {number}/{config.passes}: {COPY} against {REMAP}")
            loader.start(first)
            speed_traces.append(lockstep.run((COPY, REMAP), say, drain=True)[0])
        weights_bytes = loader.weights_bytes
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
        speed_traces,
    )


@dataclass
class _Lockstep:
    """One pass of the lockstep decode over fresh caches and sessions."""

    config: DecodeConfig
    roles: ModelRoles
    loader: Loader
    direct_loader: Loader
    prompt: list[int]
    forced: list[int]
    first: int

    def run(
        self, arms: Sequence[str], say: Callable[[str], None], drain: bool
    ) -> tuple[dict[str, ArmTrace], dict[str, dict[str, Any]]]:
        """Decode every forced token with each arm. ``drain``: load each rung's
        successor in the foreground as the arms enter the rung, so no background
        compile overlaps a timed step."""
        from ovspec.runtime.session import DecodeSession

        config, roles, loader, ladder = self.config, self.roles, self.loader, self.config.ladder
        top = ladder.top_tokens
        sessions: dict[str, DecodeSession] = {}
        kvs: dict[str, KVCache] = {}
        for arm in arms:
            if arm == DIRECT:
                kvs[arm] = make_kv(KVLayout.COPY_AND_GROW, roles, top, top)
                programs, arm_ladder = self.direct_loader, Ladder((top,))
            else:
                layout = KVLayout.REMAP if arm == REMAP else KVLayout.COPY_AND_GROW
                prefault = (
                    Prefault(ladder, config.prefault_lead_tokens) if arm == PREFAULT else None
                )
                kvs[arm] = make_kv(layout, roles, self.first, top, prefault, ladder)
                programs, arm_ladder = loader, ladder
            kvs[arm].measure_physical = True  # boundary peaks too
            sessions[arm] = DecodeSession(
                roles, arm_ladder, kvs[arm], programs, config.prefill_chunk_tokens
            )
        traces = {a: ArmTrace(a, roles.kv_bytes_per_token * top) for a in arms}
        compare = [a for a in arms if a != COPY]
        agreement: dict[str, dict[str, Any]] = {
            a: {"steps": 0, "top1_equal": 0, "min_cosine": 1.0, "boundary_steps": 0,
                "boundary_top1_equal": 0, "boundary_min_cosine": 1.0}
            for a in compare
        }  # fmt: skip
        boundary_live = {c + d for c in list(ladder)[:-1] for d in (-1, 0, 1, 2)}
        try:
            logits = {a: sessions[a].prefill(self.prompt) for a in arms}
            loader.release(prefill_specialization(self.first, config.prefill_chunk_tokens))
            if DIRECT in arms:
                self.direct_loader.release(prefill_specialization(top, config.prefill_chunk_tokens))
            for arm in arms:
                _sample(traces[arm], kvs[arm])
            on_ladder = [a for a in arms if a != DIRECT]
            passed = [c for c in ladder if c < self.first]
            entered = 0
            orders = williams_orders(list(arms), len(self.forced), config.seed)
            say(f"decoding {len(self.forced)} tokens x {len(arms)} arms in lockstep")
            for index, token in enumerate(self.forced):
                lowest = min(kvs[a].capacity_tokens for a in on_ladder)
                if drain and lowest > entered:
                    entered = lowest
                    successor = ladder.successor(lowest)
                    if successor is not None:
                        loader.load_now(successor)  # untimed: before this rung's next step
                for arm in orders[index]:
                    _timed_step(traces[arm], sessions[arm], kvs[arm], token, logits)
                _agree(agreement, logits, kvs[COPY].live_tokens in boundary_live)
                lowest = min(kvs[a].capacity_tokens for a in on_ladder)
                for rung in (c for c in ladder if c < lowest and c not in passed):
                    loader.release(rung)  # every ladder arm has left it
                    passed.append(rung)
                if (index + 1) % 256 == 0:
                    import psutil  # the bench extra, checked in run_decode

                    rss = psutil.Process().memory_info().rss
                    say(f"  {index + 1}/{len(self.forced)} tokens; RSS {rss / 2**30:.1f} GiB")
        finally:
            for arm in arms:
                sessions[arm].close()
                kvs[arm].close()
        for rung in ladder:
            loader.release(rung)  # the next pass starts from the first rung again
        return traces, agreement


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


def step_passes(run: DecodeRun) -> list[dict[str, dict[str, Sequence[float]]]]:
    """Every pass's steps per arm as plain lists (live tokens before the step, inference
    seconds): what a results document keeps so its bands can be recomputed."""
    return [
        {arm: {"live": list(t.step_live), "infer_s": list(t.step_infer_s)} for arm, t in p.items()}
        for p in [run.traces, *run.speed_traces]
    ]


def compare_bands(run: DecodeRun, arm: str) -> list[BandComparison]:
    """Per band, the arm's decode steps against copy-and-grow's at the same tokens, over
    every pass that ran the arm (each pass's tokens pair within the pass)."""
    return bands_from_steps(step_passes(run), list(run.config.ladder), arm)


def bands_from_steps(
    passes: Sequence[Mapping[str, Mapping[str, Sequence[float]]]],
    ladder: Sequence[int],
    arm: str,
) -> list[BandComparison]:
    """``compare_bands`` over saved steps (``step_passes``' form)."""
    edges = [0, *ladder]
    rows = []
    for low, high in itertools.pairwise(edges):
        a: list[float] = []
        b: list[float] = []
        for steps in passes:
            if arm not in steps:
                continue
            copy, other = steps[COPY], steps[arm]
            index = [i for i, live in enumerate(copy["live"]) if low <= live < high]
            a += [copy["infer_s"][i] for i in index]
            b += [other["infer_s"][i] for i in index]
        if len(a) < 2:
            continue
        try:
            summary = summarize_pairs(a, b, unit="s")
        except TrialError:
            continue
        mean_a = summary.mean_a
        rows.append(
            BandComparison(
                f"{low}-{high}",
                len(a),
                1000 * mean_a,
                1000 * summary.mean_b,
                summary.relative_change,
                summary.t_test.ci_low / mean_a,
                summary.t_test.ci_high / mean_a,
                summary.b_faster_pairs,
            )
        )
    return rows
