"""The NPU plugin with NPUW on CPU subdevices: its profile, and the NPU path run on it
(build into the store, import, decode) on this machine, where no NPU is present."""

from __future__ import annotations

import json
import locale
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest
from conftest import load_llm

import ovspec
import ovspec.runtime.decoding as runtime
from ovspec.compile.devices import CpuProfile, NpuProfile, NpuwProfile, profile_for
from ovspec.compile.devices.npuw import PLUGIN_MODE, USE_NPUW
from ovspec.compile.modes import LoadMode
from ovspec.compile.split import CoreSplit
from ovspec.compile.worker import blob_identity_hash
from ovspec.errors import DeviceError
from ovspec.ir.headcut import HIDDEN_OUTPUT
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import GraphRewrite
from ovspec.ir.specialize import Specialization
from ovspec.runtime.decoding import decode
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import EventKind, Policy
from ovspec.store.local import Store

NPUW = {"NPUW_DEVICES": "CPU"}
EXACT = {**NPUW, **profile_for("NPU", NPUW).exact_properties}


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
    # The NPU path's defaults: the portable rewrites, the guard NPUW needs and the head and
    # the embedding one model each for every graph.
    assert npuw.default_load_mode is LoadMode.IMPORT
    assert npuw.default_rewrites.rewrites == {
        GraphRewrite.SPLIT_ATTENTION,
        GraphRewrite.LAST_POSITION,
        GraphRewrite.RESULT_GUARD,
        GraphRewrite.SHARED_HEAD,
        GraphRewrite.SHARED_EMBEDDING,
    }
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


def test_the_npu_path_decodes_the_cpu_plugins_tokens_and_a_second_start_is_all_hits(
    fixture_dir: Path, tmp_path: Path
) -> None:
    prompt = [int(t) for t in np.load(fixture_dir / "reference.npz")["prompt_ids"]]
    keep = {"keep_logits": lambda _step, _live: True}
    with ovspec.open(
        fixture_dir, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=tmp_path / "cpu"
    ) as loader:
        control = decode(loader, prompt, max_new_tokens=40, **keep)
    runs = []
    for _ in range(2):
        with ovspec.open(
            fixture_dir, ladder="32,64", device="NPU", properties=EXACT, store=tmp_path / "npu"
        ) as loader:
            assert loader.load_mode is LoadMode.IMPORT
            runs.append(decode(loader, prompt, max_new_tokens=40, **keep))
    first, second = runs
    assert first.rungs == second.rungs == control.rungs == (32, 64)
    kinds = [
        {e.kind for e in run.events} & {EventKind.COMPILED, EventKind.STORE_HIT} for run in runs
    ]
    assert kinds == [{EventKind.COMPILED}, {EventKind.STORE_HIT}]
    # The first rung loads beside the prompt's run unwarmed (the NPU profile's choice);
    # the successor is warmed, its first step a boundary's.
    for run in runs:
        loaded = {e.spec: e.note for e in run.events if e.kind is EventKind.LOADED}
        assert loaded["decode@32"].endswith("warm-up 0.000 s")
        assert not loaded["decode@64"].endswith("warm-up 0.000 s")
    # Greedy, not teacher-forced: the same tokens. NPUW's partitions add f32 rounding
    # only (1e-5); a KV bound or grown wrongly, or NPUW's Result bug, differs by units.
    assert first.token_ids == control.token_ids == second.token_ids
    assert len(set(control.token_ids)) > len(control.token_ids) // 2  # not one token repeated
    worst = max(float(np.max(np.abs(first.logits[s] - control.logits[s]))) for s in control.logits)
    assert worst < 1e-4
    assert all(np.array_equal(first.logits[s], second.logits[s]) for s in control.logits)


def test_its_blobs_are_stored_under_their_own_keys_and_never_served_to_the_cpu(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    prompt = [1, 2, 3, 4]
    with ovspec.open(qwen2_dir, ladder="32", device="NPU", properties=EXACT, store=store) as npu:
        decode(npu, prompt, max_new_tokens=2)
    with ovspec.open(
        qwen2_dir, ladder="32", properties=EXACT_CPU_PROPERTIES, store=store, load_mode="import"
    ) as cpu:
        events = decode(cpu, prompt, max_new_tokens=2).events
    assert EventKind.STORE_HIT not in {e.kind for e in events}
    with Store(store) as opened:
        parts = {e.values()["specialization"]: e.values()["device"] for e in opened.entries()}
        parts = {s: d for s, d in parts.items() if s == "lm-head" or s.startswith("embedding:")}
        graphs = [e for e in opened.entries() if e.values()["specialization"] not in parts]
        devices = sorted(entry.values()["device"] for entry in graphs)
        identities = [entry.values()["device_architecture"] for entry in opened.entries()]
    assert devices.count("NPU") == devices.count("CPU") > 0
    # The NPU path's graphs share one LM head, an entry of its own (the embedding is the
    # host's lookup in the .bin: qwen2's table is an f16 constant).
    assert parts == {"lm-head": "NPU"}
    assert sum(PLUGIN_MODE in a for a in identities) == devices.count("NPU") + len(parts)


@pytest.mark.parametrize("policy", [Policy.ONE_AHEAD, Policy.ON_DEMAND])
@pytest.mark.parametrize("layout", list(KVLayout))
def test_every_kv_layout_and_policy_runs_on_it(
    qwen2_dir: Path, tmp_path: Path, layout: KVLayout, policy: Policy
) -> None:
    reference = np.load(qwen2_dir / "reference.npz")
    prompt = [int(t) for t in reference["prompt_ids"]]
    with ovspec.open(
        qwen2_dir,
        ladder="64,128",  # remap's rungs are whole pages of KV
        device="NPU",
        properties=EXACT,
        store=tmp_path,
        policy=policy,
        kv_layout=layout,
    ) as loader:
        result = decode(loader, prompt, max_new_tokens=60)
    assert result.rungs == (64, 128)  # one boundary crossed
    assert list(result.token_ids) == [int(t) for t in reference["generated_ids"][:60]]


def test_a_kv_bound_as_shared_memory_is_read_in_place_each_step(qwen2_dir: Path) -> None:
    """The binding ovspec uses (a numpy buffer wrapped with shared_memory, set once) is
    the request's own input: NPUW reads a write into that buffer at the next infer with
    no rebinding, so nothing copies it into the request per step. (On silicon NPUW
    copies any input it did not allocate into its NPU subrequests: docs/npu.md.)"""
    llm = load_llm(qwen2_dir)
    model = llm.specialize(Specialization.decode(32), profile_for("NPU", NPUW).default_rewrites)
    core = ov.Core()
    npuw = profile_for("NPU", EXACT)
    properties = npuw.required_properties(EXACT)
    npuw.configure_core(core, properties)
    compiled = core.compile_model(model, "NPU", properties)
    inputs = {p.get_any_name(): p for p in compiled.inputs}
    rng = np.random.default_rng(0)
    feeds = {
        name: (rng.standard_normal(list(port.get_shape())) * 0.5).astype(np.float32)
        if port.get_element_type() == ov.Type.f32
        else np.ones(list(port.get_shape()), dtype=port.get_element_type().to_dtype())
        for name, port in inputs.items()
    }
    past = llm.roles.kv[0].past_input
    bound = compiled.create_infer_request()
    for name, array in feeds.items():
        bound.set_tensor(name, ov.Tensor(array, shared_memory=True))
    assert np.shares_memory(bound.get_tensor(past).data, feeds[past])
    logits = HIDDEN_OUTPUT  # the graph ends at the hidden state (the head is shared)
    bound.infer()
    before = bound.get_tensor(logits).data.copy()
    feeds[past][...] = -feeds[past]  # in place: the request is not told
    bound.infer()
    after = bound.get_tensor(logits).data.copy()
    fresh = compiled.create_infer_request()
    expected = fresh.infer({n: a.copy() for n, a in feeds.items()})[logits]
    assert not np.allclose(before, after)
    np.testing.assert_array_equal(after, expected)


def test_a_blob_identity_reads_the_volatile_tail_as_zeros(tmp_path: Path) -> None:
    tail = NpuwProfile.volatile_blob_tail
    assert tail == (40, 8)
    body = np.random.default_rng(0).integers(0, 256, 3 * 4096, dtype=np.uint8).tobytes()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(body)
    b.write_bytes(body[:-40] + b"x" * 32 + body[-8:])  # only the token differs
    c.write_bytes(body[:-41] + b"x" + body[-40:])  # one byte before it differs
    assert blob_identity_hash(a, tail) == blob_identity_hash(b, tail)
    assert blob_identity_hash(a, tail) != blob_identity_hash(c, tail)
    assert blob_identity_hash(a) != blob_identity_hash(b)


_EXPORT = """
import json, sys, openvino as ov
from pathlib import Path
from ovspec.compile.devices import profile_for
from ovspec.ir.specialize import Specialization, prepare, read_ir
npuw = {"NPUW_DEVICES": "CPU", **(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})}
profile = profile_for("NPU", npuw)
properties = profile.required_properties(npuw)
model = prepare(read_ir(Path(sys.argv[1]))).specialize(Specialization.decode(32))
core = ov.Core()
if len(sys.argv) > 4:  # configured as a loader's Core
    profile.configure_core(core, properties)
    profile.configure_loader_core(core, properties)
blob = core.compile_model(model, "NPU", properties).export_model()
Path(sys.argv[2]).write_bytes(blob.getbuffer())
"""


def test_two_fresh_processes_export_the_same_blob_but_its_volatile_tail(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    blobs = [tmp_path / "first.blob", tmp_path / "second.blob"]
    xml = next(qwen2_dir.glob("*.xml"))
    for blob in blobs:
        subprocess.run([sys.executable, "-c", _EXPORT, str(xml), str(blob)], check=True)
    first, second = (b.read_bytes() for b in blobs)
    start, end = NpuwProfile.volatile_blob_tail or (0, 0)
    assert len(first) == len(second)
    differ = np.flatnonzero(np.frombuffer(first, np.uint8) != np.frombuffer(second, np.uint8))
    assert (
        differ.size > 0 and differ.min() >= len(first) - start and differ.max() < len(first) - end
    )
    tail = NpuwProfile.volatile_blob_tail
    assert blob_identity_hash(blobs[0], tail) == blob_identity_hash(blobs[1], tail)


_IMPORT_THREADS = """
import json, os, sys, threading, openvino as ov
from pathlib import Path
from ovspec.compile.devices import profile_for
from ovspec.ir.specialize import Specialization, prepare, read_ir
xml, host, extra = Path(sys.argv[1]), {int(sys.argv[2])}, json.loads(sys.argv[3])
npuw = {"NPUW_DEVICES": "CPU", **extra}
profile = profile_for("NPU", npuw)
properties = profile.required_properties(npuw)
core = ov.Core()
profile.configure_core(core, properties)
profile.configure_loader_core(core, properties)  # as a loader's Core with no split
model = prepare(read_ir(xml)).specialize(Specialization.decode(32))
blob = core.compile_model(model, "NPU", properties).export_model()
def tasks():
    return {int(t) for t in os.listdir("/proc/self/task")}
before, kept = tasks(), []
def load():
    os.sched_setaffinity(0, host)  # the loader's worker, on the host core
    kept.append(core.import_model(blob, "NPU", properties))
worker = threading.Thread(target=load)
worker.start()
worker.join()
made = tasks() - before
cores = sorted({c for t in made for c in os.sched_getaffinity(t)})
print(json.dumps({"made": len(made), "cores": cores}))
"""


def _threads_an_import_makes(xml: Path, host: int, extra: dict[str, str]) -> tuple[int, set[int]]:
    """How many threads an import on a thread pinned to ``host`` made, and their cores."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_THREADS, str(xml), str(host), json.dumps(extra)],
        check=True,
        capture_output=True,
        text=True,
    )
    made = json.loads(out.stdout)
    return made["made"], set(made["cores"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a device and a host core")
def test_an_import_on_a_loaders_core_keeps_its_threads_on_the_importing_cores(
    qwen2_dir: Path,
) -> None:
    """Unpinned (a loader's default with no split), an import's new threads take the
    importing thread's core; asked to pin (the control), the CPU subdevice gives some of
    them other cores too, the decode's among them."""
    xml = qwen2_dir / "openvino_model.xml"
    host = max(os.sched_getaffinity(0))
    made, cores = _threads_an_import_makes(xml, host, {})
    assert made > 0 and cores <= {host}, (made, cores)
    made, pinned = _threads_an_import_makes(xml, host, {"ENABLE_CPU_PINNING": "YES"})
    if not pinned - {host}:
        pytest.skip(f"OpenVINO pinned no import thread off core {host} here (no CPU map?)")


def test_the_cores_configuration_leaves_the_blob_as_it_was(qwen2_dir: Path, tmp_path: Path) -> None:
    """A Core configured as a loader's (CPU pinning off) exports the same blob as a plain
    one (the volatile tail aside); the control, a bank name NPUW writes into the blob,
    does not."""
    xml = qwen2_dir / "openvino_model.xml"
    arms = {
        "plain": ["{}"],
        "configured": ["{}", "configure"],
        "control": [json.dumps({"NPUW_WEIGHTS_BANK": "a-control-bank"})],
    }
    tail = NpuwProfile.volatile_blob_tail
    identity = {}
    for name, extra in arms.items():
        blob = tmp_path / f"{name}.blob"
        subprocess.run([sys.executable, "-c", _EXPORT, str(xml), str(blob), *extra], check=True)
        identity[name] = blob_identity_hash(blob, tail)
    assert identity["configured"] == identity["plain"]
    assert identity["control"] != identity["plain"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the split needs two cores")
def test_a_loader_unpins_its_cpu_subdevice_unless_split_or_asked(
    fixture_dir: Path, tmp_path: Path
) -> None:
    def pinning(properties: dict[str, str], **tuning: Any) -> bool:
        with ovspec.open(
            fixture_dir,
            ladder="32,64",
            device="NPU",
            properties=properties,
            store=tmp_path / "s",
            tuning=runtime.Tuning(**tuning),
        ) as loader:
            return bool(loader._compiler.core.get_property("CPU", "ENABLE_CPU_PINNING"))

    default = bool(ov.Core().get_property("CPU", "ENABLE_CPU_PINNING"))  # this machine's
    assert pinning(EXACT) is False
    assert pinning({**EXACT, "ENABLE_CPU_PINNING": "YES"}) is True  # asked: as asked
    # Under the split SplitPins places the threads, with the device's own pinning beside.
    assert pinning(EXACT, split=CoreSplit.default()) is default


def test_a_compile_that_exports_into_a_throwaway_cache_exports_a_blob_that_computes_alike(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    """A folded graph compiled with a CACHE_DIR (where OpenVINO exports inside
    compile_model) exports a blob of the plain one's length that imports and computes
    bit-identical outputs. Not byte-identical: NPUW writes its weights' addresses in
    this process into the blob (as keys), and those moved."""
    xml = qwen2_dir / "openvino_model.xml"
    folded = {"NPUW_FOLD": "YES", "NPUW_FUNCALL_FOR_ALL": "YES"}
    cache = tmp_path / "cache"
    outputs = {}
    core = ov.Core()
    npuw = profile_for("NPU", {**NPUW, **folded})
    properties = npuw.required_properties({**NPUW, **folded})
    imports = {**properties, "WEIGHTS_PATH": str(qwen2_dir / "openvino_model.bin")}
    feeds: dict[str, np.ndarray] = {}
    sizes = {}
    for name, extra in (("plain", folded), ("cached", {**folded, "CACHE_DIR": str(cache)})):
        blob = tmp_path / f"{name}.blob"
        subprocess.run(
            [sys.executable, "-c", _EXPORT, str(xml), str(blob), json.dumps(extra)], check=True
        )
        sizes[name] = blob.stat().st_size
        compiled = core.import_model(blob.read_bytes(), "NPU", imports)
        if not feeds:
            rng = np.random.default_rng(0)
            for port in compiled.inputs:
                shape, kind = list(port.get_shape()), port.get_element_type()
                feeds[port.get_any_name()] = (
                    (rng.standard_normal(shape) * 0.5).astype(np.float32)
                    if kind == ov.Type.f32
                    else np.ones(shape, dtype=kind.to_dtype())
                )
        result = compiled.create_infer_request().infer(feeds)
        outputs[name] = [np.array(v) for v in result.values()]
    assert any(cache.iterdir())  # the compile did export into the cache
    assert sizes["cached"] == sizes["plain"]
    assert all(
        np.array_equal(a, b) for a, b in zip(outputs["plain"], outputs["cached"], strict=True)
    )


def test_a_folded_weightless_rung_is_exported_inside_its_compile(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python binding holds the GIL through export_model; a rung (or the shared head)
    compiled with a throwaway CACHE_DIR has its slow export done inside compile_model
    instead. Only where that cache holds no weights: not for an unfolded blob (NPUW
    serializes its bank)."""
    caches: list[Path | None] = []
    compiled_names: list[str] = []
    real = ov.Core.compile_model

    def spy(self: ov.Core, *args: Any, **kwargs: Any) -> Any:
        config = args[2] if len(args) > 2 else kwargs.get("config") or {}
        name = args[0].get_friendly_name() if isinstance(args[0], ov.Model) else ""
        if "@" in name or name.startswith("ovspec-"):  # a rung's graph, or a shared part
            cache = config.get("CACHE_DIR")
            caches.append(None if cache is None else Path(cache))
            compiled_names.append(name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ov.Core, "compile_model", spy)
    before = locale.setlocale(locale.LC_ALL)
    for name, properties in (("folded", NPUW), ("unfolded", EXACT)):
        caches.clear()
        compiled_names.clear()
        with ovspec.open(
            fixture_dir, ladder="32,64", device="NPU", properties=properties, store=tmp_path / name
        ) as loader:
            decode(loader, [5, 6, 7], max_new_tokens=2)
        assert caches, "no rung graph was compiled"
        assert any(n.startswith("ovspec-") for n in compiled_names), "no shared head"
        if name == "folded":
            assert all(c is not None and not c.exists() for c in caches)  # used, then removed
            assert locale.setlocale(locale.LC_ALL) == before  # NPUW's cache export sets "C"
        else:
            assert caches == [None] * len(caches)

    def no_temporary_directory(*args: Any, **kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    # No place for the cache: the rung compiles as before, its export doing it all.
    monkeypatch.setattr("tempfile.TemporaryDirectory", no_temporary_directory)
    caches.clear()
    compiled_names.clear()
    with ovspec.open(
        fixture_dir, ladder="32,64", device="NPU", properties=NPUW, store=tmp_path / "no-tmp"
    ) as loader:
        assert len(decode(loader, [5, 6, 7], max_new_tokens=2).token_ids) == 2
    assert caches and caches == [None] * len(caches)
