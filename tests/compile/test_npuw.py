"""The NPU plugin with NPUW on CPU subdevices: its profile, and the NPU path run on it
(build into the store, import, decode) on this machine, where no NPU is present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

import ovspec
from ovspec.compile.devices import CpuProfile, NpuProfile, NpuwProfile, profile_for
from ovspec.compile.devices.npuw import PLUGIN_MODE, USE_NPUW
from ovspec.compile.modes import LoadMode
from ovspec.errors import DeviceError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import GraphRewrite
from ovspec.runtime.decoding import decode
from ovspec.runtime.loader import EventKind
from ovspec.store.local import Store

NPUW = {"NPUW_DEVICES": "CPU"}


def test_the_npu_plugin_on_cpu_subdevices_is_claimed_by_its_properties() -> None:
    assert type(profile_for("NPU", NPUW)) is NpuwProfile
    assert type(profile_for("NPU.0", {"NPUW_DEVICES": "CPU,GPU"})) is NpuwProfile
    assert type(profile_for("NPU", {"NPUW_DEVICES": "NPU,CPU"})) is NpuProfile  # silicon
    assert type(profile_for("NPU")) is NpuProfile
    assert type(profile_for("CPU", NPUW)) is CpuProfile  # not the NPU plugin at all


def test_its_properties_are_completed_and_a_contradiction_refused() -> None:
    npuw = profile_for("NPU", NPUW)
    assert npuw.required_properties(NPUW) == {**NPUW, USE_NPUW: "YES"}
    assert npuw.loader_properties(NPUW) == {**NPUW, USE_NPUW: "YES"}
    with pytest.raises(DeviceError, match="NPU_USE_NPUW=NO turns off"):
        npuw.required_properties({**NPUW, USE_NPUW: "NO"})
    # The NPU path's defaults; split attention is left out (NPUW refuses its graphs).
    assert npuw.default_load_mode is LoadMode.IMPORT
    assert npuw.default_rewrites.rewrites == {GraphRewrite.LAST_POSITION}
    assert npuw.trial_properties(NPUW, frozenset({"NPU_BYPASS_UMD_CACHING"})) == NPUW


def test_its_identity_names_the_mode_and_the_subdevice() -> None:
    core = ov.Core()
    facts = profile_for("NPU", NPUW).resolve(core, NPUW)
    identity = dict(facts.identity)
    assert not facts.offline and facts.device == "NPU"
    assert identity[PLUGIN_MODE] == "NPUW on CPU subdevices"
    cpu = dict(profile_for("CPU").resolve(core, {}).identity)
    assert identity["CPU:FULL_DEVICE_NAME"] == cpu["FULL_DEVICE_NAME"]
    with pytest.raises(DeviceError, match="'XPU' is not available here"):
        profile_for("NPU", {"NPUW_DEVICES": "XPU"}).resolve(core, {"NPUW_DEVICES": "XPU"})


def test_the_npu_path_runs_on_the_plugin_and_a_second_start_is_all_hits(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    keep = {"keep_logits": lambda _step, _live: True}
    with ovspec.open(
        qwen2_dir, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=tmp_path / "cpu"
    ) as loader:
        control = decode(loader, prompt, max_new_tokens=30, **keep)
    runs = []
    for _ in range(2):
        with ovspec.open(
            qwen2_dir, ladder="32,64", device="NPU", properties=NPUW, store=tmp_path / "npu"
        ) as loader:
            assert loader.load_mode is LoadMode.IMPORT
            runs.append(decode(loader, prompt, forced_ids=control.token_ids, **keep))
    first, second = runs
    assert first.rungs == second.rungs == control.rungs == (32, 64)
    kinds = [
        {e.kind for e in run.events} & {EventKind.COMPILED, EventKind.STORE_HIT} for run in runs
    ]
    assert kinds == [{EventKind.COMPILED}, {EventKind.STORE_HIT}]
    # Teacher-forced on the CPU plugin's tokens: NPUW's CPU subgraphs run at the CPU's
    # default precision (bf16 where it has it), so logits are close, not equal; a KV
    # bound or grown wrongly would differ by whole units.
    steps = sorted(control.logits)
    worst = max(float(np.max(np.abs(first.logits[s] - control.logits[s]))) for s in steps)
    agree = np.mean([np.argmax(first.logits[s]) == np.argmax(control.logits[s]) for s in steps])
    assert worst < 1.0 and agree >= 0.8
    assert all(np.array_equal(first.logits[s], second.logits[s]) for s in steps)
    # Its blobs are stored under its own keys: never served to the CPU plugin.
    with Store(tmp_path / "npu") as store:
        devices = {entry.values()["device"] for entry in store.entries()}
        architectures = {entry.values()["device_architecture"] for entry in store.entries()}
    assert devices == {"NPU"} and all(PLUGIN_MODE in a for a in architectures)
