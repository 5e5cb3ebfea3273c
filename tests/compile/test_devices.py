"""Device facts and which compile properties stay out of blob keys (proved on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openvino as ov
import pytest

from ovspec.compile.devices import profile_for
from ovspec.compile.devices.facts import blob_control, choose_blob_control
from ovspec.errors import DeviceError

# Exports in one process embed per-process node-name counters, so each variant
# compiles in a fresh interpreter, where CPU exports are byte-deterministic.
EXPORT_SCRIPT = """
import json, sys, xxhash, openvino as ov
from ovspec.ir.specialize import Specialization, prepare, read_ir
llm = prepare(read_ir(sys.argv[1]))
props = json.loads(sys.argv[2])
compiled = ov.Core().compile_model(llm.specialize(Specialization.decode(32)), "CPU", props)
print(xxhash.xxh3_128_hexdigest(compiled.export_model().getvalue()))
"""

# A non-default value for each property CPU's key leaves out.
NEUTRAL_VARIANTS = {
    "PERF_COUNT": "YES",
    "LOG_LEVEL": "LOG_WARNING",
    "CACHE_DIR": "{tmp}/ov-cache",
    "NUM_STREAMS": "2",
    "INFERENCE_NUM_THREADS": "1",
    "ENABLE_CPU_PINNING": "NO",
    "ENABLE_CPU_RESERVATION": "YES",
    "ENABLE_HYPER_THREADING": "NO",
    "SCHEDULING_CORE_TYPE": "PCORE_ONLY",
    "PERFORMANCE_HINT": "THROUGHPUT",
    "PERFORMANCE_HINT_NUM_REQUESTS": "2",
}


def export_digest(model_xml: Path, props: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", EXPORT_SCRIPT, str(model_xml), json.dumps(props)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.mark.slow
def test_properties_left_out_of_cpu_keys_do_not_change_the_blob(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    cpu = profile_for("CPU")
    assert set(NEUTRAL_VARIANTS) == cpu.blob_neutral_properties
    xml = qwen2_dir / "openvino_model.xml"
    variants = {k: {k: v.format(tmp=tmp_path)} for k, v in NEUTRAL_VARIANTS.items()}
    # The control: a property that changes the blob on this CPU (chosen from what the
    # device reports, so an AVX2-only CPU that already runs f32 gets one too).
    control_name, control_value = blob_control(ov.Core(), "CPU")
    variants["control"] = {control_name: control_value}
    with ThreadPoolExecutor(max_workers=2) as pool:
        baseline = pool.submit(export_digest, xml, {})
        futures = {name: pool.submit(export_digest, xml, p) for name, p in variants.items()}
        digests = {name: f.result() for name, f in futures.items()}
    control = digests.pop("control")
    assert control != baseline.result(), (
        f"the control {control_name}={control_value} shows blob differences are detectable"
    )
    assert digests == dict.fromkeys(digests, baseline.result())
    # ...and the key agrees: neutral properties leave it unchanged, the control does not.
    for props in variants.values():
        changed = cpu.key_properties(props) != cpu.key_properties({})
        assert changed == (control_name in props)


@pytest.mark.parametrize(
    ("capabilities", "default", "expected"),
    [
        # AVX2-only: f32 is all there is, so the control changes what the blob holds.
        (["FP32", "INT8", "BIN", "EXPORT_IMPORT"], "f32", ("CACHE_MODE", "OPTIMIZE_SIZE")),
        # AVX-512 with bf16 hardware (or AMX): bf16 by default; f32 changes the graph.
        (
            ["FP32", "BF16", "INT8", "BIN", "EXPORT_IMPORT"],
            "bf16",
            ("INFERENCE_PRECISION_HINT", "f32"),
        ),
        # AMX-FP16 / ARM with f16 by default.
        (["FP32", "FP16", "INT8", "EXPORT_IMPORT"], "f16", ("INFERENCE_PRECISION_HINT", "f32")),
        # bf16 offered but f32 chosen (EXECUTION_MODE_HINT=ACCURACY, or a user default).
        (["FP32", "BF16"], "f32", ("INFERENCE_PRECISION_HINT", "bf16")),
        (["FP32", "FP16"], "f32", ("INFERENCE_PRECISION_HINT", "f16")),
        # A device that reports nothing (NPU offline).
        ([], "", ("CACHE_MODE", "OPTIMIZE_SIZE")),
    ],
)
def test_blob_control_follows_what_the_device_reports(
    capabilities: list[str], default: str, expected: tuple[str, str]
) -> None:
    assert choose_blob_control(capabilities, default) == expected


def test_key_properties_are_canonical() -> None:
    cpu, npu = profile_for("CPU"), profile_for("NPU")
    a = cpu.key_properties({"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"})
    b = cpu.key_properties({"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"})
    assert a == b
    # NPU keeps PERFORMANCE_HINT in the key: it is only known neutral on CPU.
    assert npu.key_properties({"PERFORMANCE_HINT": "LATENCY"}) != npu.key_properties({})


def test_cpu_facts_name_the_processor() -> None:
    facts = profile_for("CPU").resolve(ov.Core(), {})
    names = dict(facts.identity)
    assert "FULL_DEVICE_NAME" in names and "DEVICE_ARCHITECTURE" in names
    assert not facts.offline


def test_unknown_device_is_a_clear_error() -> None:
    with pytest.raises(DeviceError, match="device 'XPU' is not available here"):
        profile_for("XPU").resolve(ov.Core(), {})


def test_absent_npu_explains_offline_compile() -> None:
    if "NPU" in ov.Core().available_devices:
        pytest.skip("this machine has an NPU")
    with pytest.raises(DeviceError, match="NPU_PLATFORM"):
        profile_for("NPU").resolve(ov.Core(), {})
