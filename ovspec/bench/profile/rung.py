"""``ovspec profile``'s library half: where a rung's decode step goes, next to the dynamic
stateful model at the same live length, and the measured floors.

Owns ``profile_rung``: per-op-type time from OpenVINO's ``PERF_COUNT`` for one decode
step of a rung (the graph ``ovspec.open`` would run: the device's rewrites) and of the
original stateful IR holding the same live tokens, each the median of a few steps, in
both compile orders (of two graphs compiled in one process the earlier one steps slower
on some machines), plus two measured floors: the stateful model's whole step, and a
weights-only read (every thread summing the ``.bin`` as it sits in memory).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import openvino as ov

from ovspec.compile.devices import profile_for
from ovspec.errors import BadRequestError, arg
from ovspec.ir.graph_io import LIVE_TOKENS_VARIABLE
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.rewrites import GraphRewrite, RewriteSet
from ovspec.ir.specialize import Specialization, prepare, read_ir, serving_spec

DEFAULT_PROFILE_STEPS = 8
CompileOrder = Literal["both", "rung-first", "stateful-first"]
COMPILE_ORDERS: tuple[CompileOrder, ...] = ("both", "rung-first", "stateful-first")


@dataclass(frozen=True)
class StepProfile:
    """One graph's decode step: wall time and per-op-type time, medians over steps."""

    step_ms: float
    by_type_ms: dict[str, float] = field(default_factory=dict)

    @property
    def summed_ms(self) -> float:
        """The per-type times added up (above ``step_ms`` when nodes ran in parallel)."""
        return sum(self.by_type_ms.values())


@dataclass(frozen=True)
class RungProfile:
    model: str
    device: str
    capacity_tokens: int
    live_tokens: int
    steps: int
    rewrites: str
    rung: StepProfile
    # genai's two CPU backends on the same IR: the stateful model (ATTENTION_BACKEND
    # "SDPA") and the PagedAttention graph (its default, "PA"); None where they cannot run
    stateful: StepProfile | None  # a stateless IR has no dynamic peer
    weights_bytes: int
    weights_read_ms: float  # every thread summing the .bin's bytes, already in memory
    kv_bytes: int  # the rung's live KV at this length
    graph: str = ""  # the specialization whose graph stepped: decode@C, or prefill@CxP
    # rung step / stateful step with each graph compiled first ("rung-first",
    # "stateful-first"): the steps above combine the orders profiled (geometric mean)
    order_ratios: dict[str, float] = field(default_factory=dict)
    paged: StepProfile | None = None  # the stateful IR on a device without PagedAttention

    def __post_init__(self) -> None:
        if not 0 <= self.live_tokens < self.capacity_tokens:
            raise BadRequestError(
                f"live tokens {self.live_tokens} must be below the rung {self.capacity_tokens}"
            )

    def to_json(self) -> dict[str, Any]:
        def step(profile: StepProfile | None) -> dict[str, Any] | None:
            if profile is None:
                return None
            return {"step_ms": profile.step_ms, "by_type_ms": profile.by_type_ms}

        return {
            "model": self.model,
            "device": self.device,
            "capacity_tokens": self.capacity_tokens,
            "live_tokens": self.live_tokens,
            "steps": self.steps,
            "rewrites": self.rewrites,
            "graph": self.graph,
            "rung": step(self.rung),
            "stateful": step(self.stateful),
            "paged": step(self.paged),
            "order_ratios": self.order_ratios,
            "floor": {
                "stateful_step_ms": None if self.stateful is None else self.stateful.step_ms,
                "paged_step_ms": None if self.paged is None else self.paged.step_ms,
                "weights_read_ms": self.weights_read_ms,
                "weights_bytes": self.weights_bytes,
                "kv_bytes": self.kv_bytes,
            },
        }


def _by_type(request: ov.InferRequest) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for info in request.get_profiling_info():
        if info.status == ov.ProfilingInfo.Status.EXECUTED:
            out[info.node_type] += info.real_time.total_seconds() * 1e3
    return dict(out)


def _medians(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    types = {t for sample in samples for t in sample}
    med = {t: statistics.median(s.get(t, 0.0) for s in samples) for t in types}
    return dict(sorted(med.items(), key=lambda kv: -kv[1]))


@dataclass
class Stepper:
    """One graph ready to run the same decode step again and again.

    ``calls``: the request's infers so far (a peer's prompt ran on it). Where the device
    reports PERF_COUNT as the mean over every call of the request (``running_mean``;
    the CPU plugin does), a step's own time per type is the change in the running
    total: mean_k * k - mean_{k-1} * (k-1)."""

    request: ov.InferRequest
    before: Callable[[], None] | None = None  # puts the live length back
    keep: tuple[Any, ...] = ()  # arrays the request's shared tensors point into
    calls: int = 0
    running_mean: bool = False
    _totals: dict[str, float] = field(default_factory=dict)

    def step(self) -> tuple[float, dict[str, float]]:
        if self.running_mean and self.calls and not self._totals:  # the calls before ours
            self._totals = {t: m * self.calls for t, m in _by_type(self.request).items()}
        if self.before is not None:
            self.before()
        began = time.perf_counter()
        self.request.infer()
        wall = (time.perf_counter() - began) * 1e3
        self.calls += 1
        reported = _by_type(self.request)
        if not self.running_mean:
            return wall, reported
        totals = {t: mean * self.calls for t, mean in reported.items()}
        own = {t: max(total - self._totals.get(t, 0.0), 0.0) for t, total in totals.items()}
        self._totals = totals
        return wall, own


def interleaved(steppers: Sequence[Stepper], steps: int) -> list[StepProfile]:
    """Each stepper ``steps`` times, alternating step by step (a shared machine's load
    hits them alike); the first call of each pays one-time costs and is not counted."""
    for stepper in steppers:
        stepper.step()
    walls: list[list[float]] = [[] for _ in steppers]
    samples: list[list[dict[str, float]]] = [[] for _ in steppers]
    for round_index in range(steps):
        order = list(range(len(steppers)))
        if round_index % 2:
            order.reverse()
        for i in order:
            wall, by_type = steppers[i].step()
            walls[i].append(wall)
            samples[i].append(by_type)
    return [
        StepProfile(statistics.median(w), _medians(t)) for w, t in zip(walls, samples, strict=True)
    ]


def combined(profiles: Sequence[StepProfile]) -> StepProfile:
    """One graph profiled in several compile orders: the geometric mean of the steps, the
    mean of each op type's time (a type missing from one order counts 0 there)."""
    if len(profiles) == 1:
        return profiles[0]
    types = {t for profile in profiles for t in profile.by_type_ms}
    by_type = {t: statistics.fmean(p.by_type_ms.get(t, 0.0) for p in profiles) for t in types}
    step = math.exp(statistics.fmean(math.log(p.step_ms) for p in profiles))
    return StepProfile(step, dict(sorted(by_type.items(), key=lambda kv: -kv[1])))


def _rung_step(
    core: ov.Core,
    model_dir: ModelDir,
    spec: Specialization,
    live_tokens: int,
    device: str,
    properties: Mapping[str, str],
    rewrites: RewriteSet,
) -> tuple[Stepper, int]:
    llm = prepare(read_ir(model_dir.xml_path))
    compiled = core.compile_model(llm.specialize(spec, rewrites), device, dict(properties))
    request = compiled.create_infer_request()
    roles = llm.roles
    rng = np.random.default_rng(0)
    kv_bytes = 0
    pasts: list[np.ndarray] = []  # a shared-memory tensor does not keep its array alive
    for role in roles.kv:
        past = np.zeros(role.shape(1, spec.capacity_tokens), dtype=role.element_type.to_dtype())
        index = [slice(None)] * past.ndim
        index[role.seq_axis] = slice(0, live_tokens)
        past[tuple(index)] = rng.standard_normal(past[tuple(index)].shape)
        kv_bytes += past[tuple(index)].nbytes
        pasts.append(past)
        request.set_tensor(role.past_input, ov.Tensor(past, shared_memory=True))
    names = {port.get_any_name() for port in compiled.inputs}
    request.set_tensor(roles.input_ids, ov.Tensor(np.array([[5]], dtype=np.int64)))
    before: Callable[[], None] | None = None
    if roles.attention_mask in names:
        mask = np.zeros((1, spec.capacity_tokens + 1), dtype=np.int64)
        mask[0, :live_tokens] = 1
        mask[0, spec.capacity_tokens] = 1
        request.set_tensor(roles.attention_mask, ov.Tensor(mask))
        if roles.position_ids is not None and roles.position_ids in names:
            request.set_tensor(
                roles.position_ids, ov.Tensor(np.array([[live_tokens]], dtype=np.int64))
            )
    else:  # the live-tokens state: every step starts again from the same length
        state = next(s for s in request.query_state() if s.name == LIVE_TOKENS_VARIABLE)
        held = ov.Tensor(np.array([live_tokens], dtype=np.int32))

        def before() -> None:
            state.state = held

    running_mean = profile_for(device, properties).perf_count_running_mean
    return Stepper(request, before, tuple(pasts), running_mean=running_mean), kv_bytes


class PagedPeer:
    """The IR in the PagedAttention form genai's default CPU backend compiles (ovspec's
    ``load_mode="paged"``), compiled once: decode steps at any live length."""

    def __init__(
        self, model_dir: ModelDir, device: str, properties: Mapping[str, str], core: ov.Core
    ) -> None:
        from ovspec.ir.paged import paged_model

        self.running_mean = profile_for(device, properties).perf_count_running_mean
        self._compiled = core.compile_model(
            paged_model(model_dir.xml_path).model, device, dict(properties)
        )

    def stepper(self, live_tokens: int, capacity_tokens: int) -> Stepper:
        """A decode step from ``live_tokens`` (its prompt run first), repeatable."""
        from ovspec.ladder import Ladder
        from ovspec.runtime.paged import PagedSequence

        sequence = PagedSequence(
            self._compiled, Ladder((capacity_tokens,)), capacity_tokens, 256, time.perf_counter()
        )
        if live_tokens:
            sequence.prefill([1 + (i * 7) % 97 for i in range(live_tokens)])

        def again() -> None:  # the step rewrites the same slot each time
            sequence.kv.live_tokens = live_tokens
            sequence.feed([5])

        return Stepper(
            sequence.request,
            again,
            (sequence,),
            calls=len(sequence.steps),
            running_mean=self.running_mean,
        )


class StatefulPeer:
    """The original stateful IR compiled once: decode steps at any live length."""

    def __init__(
        self, model_dir: ModelDir, device: str, properties: Mapping[str, str], core: ov.Core
    ) -> None:
        model = read_ir(model_dir.xml_path)
        self.running_mean = profile_for(device, properties).perf_count_running_mean
        self.stateful = bool(model.get_variables())
        self._compiled = (
            core.compile_model(model, device, dict(properties)) if self.stateful else None
        )

    def stepper(self, live_tokens: int) -> Stepper | None:
        """A decode step from ``live_tokens``, repeatable; None for a stateless IR."""
        if self._compiled is None:
            return None
        request = self._compiled.create_infer_request()
        names = {port.get_any_name() for port in self._compiled.inputs}

        def feed(ids: Sequence[int], start: int) -> None:
            n = len(ids)
            request.set_tensor("input_ids", ov.Tensor(np.array([ids], dtype=np.int64)))
            mask = np.ones((1, start + n), dtype=np.int64)
            request.set_tensor("attention_mask", ov.Tensor(mask))
            if "position_ids" in names:
                positions = np.arange(start, start + n, dtype=np.int64)[None]
                request.set_tensor("position_ids", ov.Tensor(positions))
            if "beam_idx" in names:
                request.set_tensor("beam_idx", ov.Tensor(np.zeros(1, dtype=np.int32)))

        request.reset_state()
        prompt = [1 + (i * 7) % 97 for i in range(live_tokens)]
        calls = 0
        for start in range(0, live_tokens, 256):
            feed(prompt[start : start + 256], start)
            request.infer()
            calls += 1
        saved = [(s, ov.Tensor(np.array(s.state.data, copy=True))) for s in request.query_state()]
        feed([5], live_tokens)

        def restore() -> None:  # every step decodes at the same length
            for state, tensor in saved:
                state.state = tensor

        return Stepper(
            request, restore if live_tokens else None, calls=calls, running_mean=self.running_mean
        )


def stateful_floor_ms(
    model_dir: ModelDir,
    live_tokens: Sequence[int],
    device: str,
    properties: Mapping[str, str],
    steps: int = DEFAULT_PROFILE_STEPS,
) -> dict[int, float]:
    """The dynamic stateful model's decode step (median ms) at each live length: the
    measured floor a rung's step is held to. Empty for a stateless IR."""
    peer = StatefulPeer(model_dir, device, properties, ov.Core())
    out: dict[int, float] = {}
    for live in live_tokens:
        stepper = peer.stepper(live)
        if stepper is not None:
            out[live] = interleaved([stepper], steps)[0].step_ms
    return out


def weights_read_ms(bin_path: Path, repeats: int = 3) -> tuple[int, float]:
    """Bytes of ``bin_path`` and the median ms for every thread to sum them as int64
    (the pages are read once first, so this is memory bandwidth, not the disk)."""
    data = np.memmap(bin_path, dtype=np.uint8, mode="r")
    words = data[: data.size // 8 * 8].view(np.int64)
    threads = max(1, os.cpu_count() or 1)
    parts = np.array_split(words, threads)
    times: list[float] = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats + 1):
            began = time.perf_counter()
            list(pool.map(np.sum, parts))  # numpy's reductions release the GIL
            times.append((time.perf_counter() - began) * 1e3)
    return int(data.size), statistics.median(times[1:])


def profile_rung(
    model_dir: ModelDir,
    capacity_tokens: int,
    live_tokens: int | None = None,
    device: str = "CPU",
    properties: Mapping[str, str] | None = None,
    rewrites: RewriteSet | None = None,
    steps: int = DEFAULT_PROFILE_STEPS,
    chunk_tokens: int | None = None,
    prompt_rung: bool = False,
    compile_order: CompileOrder = "both",
) -> RungProfile:
    """Profile decode@``capacity_tokens`` holding ``live_tokens`` (default: capacity - 1)
    next to the stateful IR holding as many, with ``PERF_COUNT`` on for both. With
    ``prompt_rung``, ``chunk_tokens`` and the live-tokens rewrite the step runs on the
    rung's prefill graph (1..P tokens), as ``ovspec.open`` on CPU runs the prompt's rung;
    otherwise on the rung's own decode graph, as every later rung runs.

    ``compile_order`` "both" profiles the pair twice in this process, the rung compiled
    first, then (after both are freed) the stateful model first, and combines the two:
    on some machines the graph compiled first steps slower, whichever it is, and the
    combination cancels that."""
    if steps < 1:
        raise BadRequestError(f"{arg('steps', str(steps))} must be at least 1")
    if compile_order not in COMPILE_ORDERS:
        raise BadRequestError(
            f"{arg('compile_order', str(compile_order))} must be one of {', '.join(COMPILE_ORDERS)}"
        )
    live = capacity_tokens - 1 if live_tokens is None else live_tokens
    if not 0 <= live < capacity_tokens:
        raise BadRequestError(
            f"{arg('live_tokens', str(live))} must be at least 0 and below the rung "
            f"{capacity_tokens}"
        )
    default = profile_for(device, properties or {}).default_rewrites
    rewrite_set = rewrites if rewrites is not None else default
    props = {**(properties or {}), "PERF_COUNT": "YES"}
    core = ov.Core()
    one_graph = chunk_tokens if GraphRewrite.LIVE_STATE in rewrite_set else None
    decode = Specialization.decode(capacity_tokens)
    spec = serving_spec(decode, one_graph, capacity_tokens if prompt_rung else None)

    paged_runs = profile_for(device, properties or {}).runs_paged_attention

    def peers() -> list[Stepper]:
        stateful = StatefulPeer(model_dir, device, props, core).stepper(live)
        if stateful is None:
            return []
        if not paged_runs:
            return [stateful]
        return [stateful, PagedPeer(model_dir, device, props, core).stepper(live, capacity_tokens)]

    def pair(rung_first: bool) -> tuple[StepProfile, list[StepProfile], int]:
        if rung_first:
            rung_stepper, kv_bytes = _rung_step(
                core, model_dir, spec, live, device, props, rewrite_set
            )
            others = peers()
        else:
            others = peers()
            rung_stepper, kv_bytes = _rung_step(
                core, model_dir, spec, live, device, props, rewrite_set
            )
        profiles = interleaved([rung_stepper, *others], steps)
        return profiles[0], profiles[1:], kv_bytes

    orders = {"rung-first": True, "stateful-first": False}
    runs: dict[str, tuple[StepProfile, list[StepProfile], int]] = {}
    for name, rung_first in orders.items():
        if compile_order in ("both", name):
            runs[name] = pair(rung_first)
            gc.collect()  # every graph is gone before the next order compiles its own
            if not runs[name][1]:
                break  # a stateless IR: no peer to compile first
    rung = combined([r for r, _, _ in runs.values()])
    by_peer = [[p[i] for _, p, _ in runs.values() if len(p) > i] for i in range(2)]
    stateful, paged = (combined(found) if found else None for found in by_peer)
    ratios = {name: r.step_ms / p[0].step_ms for name, (r, p, _) in runs.items() if p}
    kv_bytes = next(iter(runs.values()))[2]
    size, read_ms = weights_read_ms(model_dir.bin_path)
    return RungProfile(
        model=str(model_dir.root),
        device=device,
        capacity_tokens=capacity_tokens,
        live_tokens=live,
        steps=steps,
        rewrites=rewrite_set.canonical,
        rung=rung,
        stateful=stateful,
        weights_bytes=size,
        weights_read_ms=read_ms,
        kv_bytes=kv_bytes,
        graph=spec.label,
        order_ratios=ratios,
        paged=paged,
    )
