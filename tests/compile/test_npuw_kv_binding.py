"""Which KV binding the NPU plugin's NPUW (on CPU subdevices) reads without a copy per
inference, measured: the extra step time a larger KV costs, per KV byte, for each binding,
against a binding that copies the KV into the request every step."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
from conftest import load_llm

from ovspec.compile.devices import profile_for
from ovspec.ir.specialize import DynamicLLM, Specialization

NPUW = {"NPUW_DEVICES": "CPU"}
EXACT = {**NPUW, **profile_for("NPU", NPUW).exact_properties}
# A small and a large rung of tests/data/qwen2 (512 KV bytes a token: 64 KiB and 4 MiB).
SMALL_TOKENS, LARGE_TOKENS = 128, 8192
BINDINGS = ("shared", "own", "copy")
ROUNDS = 150  # interleaved steps per binding and rung; each figure is a median of pairs


def _steps(llm: DynamicLLM, capacity_tokens: int) -> tuple[dict[str, Callable[[], None]], int]:
    """One request per binding of a decode graph of ``capacity_tokens``, and its KV bytes:
    ``shared`` a numpy buffer wrapped with shared_memory and set once (ovspec's binding),
    ``own`` the request's own tensors (what NPUW allocated), ``copy`` a fresh copy of the
    KV set before every step (the control: a binding that copies)."""
    npuw = profile_for("NPU", EXACT)
    properties = npuw.required_properties(EXACT)
    core = ov.Core()
    npuw.configure_core(core, properties)
    model = llm.specialize(Specialization.decode(capacity_tokens), npuw.default_rewrites)
    compiled = core.compile_model(model, "NPU", properties)
    pasts = {role.past_input for role in llm.roles.kv}
    feeds = {
        p.get_any_name(): np.zeros(list(p.get_shape()), p.get_element_type().to_dtype())
        for p in compiled.inputs
    }
    steps: dict[str, Callable[[], None]] = {}
    for binding in BINDINGS:
        request = compiled.create_infer_request()
        for name, array in feeds.items():
            if binding == "shared":
                request.set_tensor(name, ov.Tensor(array, shared_memory=True))
            else:
                request.get_tensor(name).data[...] = array

        def step(request: ov.InferRequest = request, copies: bool = binding == "copy") -> None:
            if copies:
                for name in pasts:
                    request.set_tensor(name, ov.Tensor(feeds[name]))  # copies the array
            request.infer()

        steps[binding] = step
    return steps, sum(feeds[name].nbytes for name in pasts)


def test_the_shared_memory_kv_costs_no_copy_per_step_as_the_kv_grows(qwen2_dir: Path) -> None:
    """Per binding, the median over interleaved rounds of (large-rung step − small-rung
    step) per extra KV byte: a copy per step makes it grow with the KV. ovspec's binding
    must cost under half of what the copying control costs per byte, as NPUW's own
    tensors do; the control must show a cost, or the measurement could not see a copy."""
    llm = load_llm(qwen2_dir)
    small, small_bytes = _steps(llm, SMALL_TOKENS)
    large, large_bytes = _steps(llm, LARGE_TOKENS)
    for steps in (small, large):  # first inferences allocate: not timed
        for step in steps.values():
            step()
    extra_s: dict[str, list[float]] = {b: [] for b in BINDINGS}
    for _ in range(ROUNDS):
        for binding in BINDINGS:
            began = time.perf_counter()
            small[binding]()
            mid = time.perf_counter()
            large[binding]()
            extra_s[binding].append((time.perf_counter() - mid) - (mid - began))
    per_byte_ns = {
        b: 1e9 * float(np.median(v)) / (large_bytes - small_bytes) for b, v in extra_s.items()
    }
    copy_cost = per_byte_ns["copy"] - per_byte_ns["own"]
    assert copy_cost > 0, per_byte_ns  # the control's copy is seen
    assert per_byte_ns["shared"] - per_byte_ns["own"] < 0.5 * copy_cost, per_byte_ns
