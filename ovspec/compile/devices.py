"""Devices: is the requested device usable here, and what identifies its compiler.

Answers two questions for blob keys and clear errors: which read-only facts name
the device and its compiler/driver (architecture, versions, platform), and which
compile properties can change a blob (the rest are left out of the key on purpose).
"""

from __future__ import annotations

import difflib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import openvino as ov

from ovspec.errors import DeviceError, arg, openvino_message
from ovspec.store.keys import canonical_mapping

# Read-only properties that identify what compiles the blob. Each is read only if the
# device lists it in SUPPORTED_PROPERTIES, so one list serves every device.
# CPU blobs also carry RUNTIME_REQUIREMENTS (OpenVINO version and ISA, checked at
# import), read from a compiled probe below.
IDENTITY_PROPERTIES: tuple[str, ...] = (
    "DEVICE_ARCHITECTURE",
    "FULL_DEVICE_NAME",
    "NPU_COMPILER_VERSION",
    "NPU_DRIVER_VERSION",
    "NPU_COMPILER_TYPE",
    "GPU_DEVICE_ID",
    "DEVICE_GOPS",
)

# Properties that cannot change an exported blob, per device family: scheduling,
# threading, logging and cache plumbing. They are left out of the key. CPU's list was
# measured (tests/test_devices.py compiles with each one in a fresh process and
# compares export bytes); other families keep only what is neutral by construction.
# Anything not listed is in the key: an unknown property costs a recompile, never a
# wrong blob.
_ALWAYS_NEUTRAL = frozenset({"PERF_COUNT", "LOG_LEVEL", "CACHE_DIR"})
BLOB_NEUTRAL_PROPERTIES: dict[str, frozenset[str]] = {
    "CPU": _ALWAYS_NEUTRAL
    | {
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
        "ENABLE_CPU_PINNING",
        "ENABLE_CPU_RESERVATION",
        "ENABLE_HYPER_THREADING",
        "SCHEDULING_CORE_TYPE",
        "PERFORMANCE_HINT",
        "PERFORMANCE_HINT_NUM_REQUESTS",
    },
}


def blob_neutral_properties(device: str) -> frozenset[str]:
    return BLOB_NEUTRAL_PROPERTIES.get(device_family(device), _ALWAYS_NEUTRAL)


# Offline NPU compiles (no device) need the plugin compiler and a named platform.
NPU_PLATFORM_PROPERTY = "NPU_PLATFORM"


@dataclass(frozen=True)
class DeviceFacts:
    """What identifies the compiler of a device, as text for keys and reports."""

    device: str
    identity: tuple[tuple[str, str], ...]
    offline: bool  # compiling for a device that is not present (NPU with NPU_PLATFORM)

    @property
    def architecture(self) -> str:
        return canonical_mapping(self.identity)


def device_family(device: str) -> str:
    """``NPU.0`` -> ``NPU``; ``CPU`` -> ``CPU``."""
    return device.split(".", 1)[0].upper()


def resolve_device(core: ov.Core, device: str, properties: Mapping[str, str]) -> DeviceFacts:
    """Check ``device`` can compile here; read the facts that go into a blob key."""
    available = list(core.available_devices)
    family = device_family(device)
    if device not in available and device.upper() not in available:
        if family == "NPU" and NPU_PLATFORM_PROPERTY in properties:
            # Offline compile: the device is absent, so its identity is the platform
            # the user named plus the plugin compiler's version if it reports one.
            identity = {NPU_PLATFORM_PROPERTY: properties[NPU_PLATFORM_PROPERTY]}
            identity.update(_read_identity(core, family))
            return DeviceFacts(family, tuple(sorted(identity.items())), offline=True)
        hint = ""
        if family == "NPU":
            hint = (
                "; offline NPU compiles need the NPU plugin compiler library (not in the pip "
                f"wheel) and {arg('properties', 'NPU_PLATFORM=4000')} (your platform) with "
                f"{arg('properties', 'NPU_COMPILER_TYPE=PLUGIN')}"
            )
        raise DeviceError(
            f"device {device!r} is not available here (available: {', '.join(available)}){hint}"
        )
    check_properties(core, device, properties)
    return DeviceFacts(device, tuple(sorted(_read_identity(core, device).items())), offline=False)


# Properties the OpenVINO core takes for any device (not in a plugin's
# SUPPORTED_PROPERTIES), and the ones ovspec itself passes.
CORE_PROPERTIES = frozenset(
    {"CACHE_DIR", "CACHE_MODE", "ENABLE_MMAP", "FORCE_TBB_TERMINATE", "WEIGHTS_PATH"}
    | {"ENABLE_WEIGHTLESS"}
)
_CHECKED_PROPERTIES: set[tuple[str, tuple[tuple[str, str], ...]]] = set()


def check_properties(core: ov.Core, device: str, properties: Mapping[str, str]) -> None:
    """Refuse properties the device does not know or will not take, before
    anything compiles (issue 10: they passed ``build`` and failed at import, exit 3).

    Names are checked against the device's SUPPORTED_PROPERTIES; values by compiling,
    exporting and importing a one-op probe with them (~0.1 s, once per process and set
    of properties): the plugins check values only when a model is compiled.
    """
    if not properties:
        return
    memo = (device, tuple(sorted(properties.items())))
    if memo in _CHECKED_PROPERTIES:
        return
    try:
        supported = {str(p) for p in core.get_property(device, "SUPPORTED_PROPERTIES")}
    except RuntimeError:
        supported = set()
    if supported:
        unknown = sorted(k for k in properties if k not in supported | CORE_PROPERTIES)
        if unknown:
            near = difflib.get_close_matches(unknown[0].upper(), sorted(supported), n=1)
            hint = f"did you mean {near[0]}?" if near else f"it lists {len(supported)};"
            raise DeviceError(
                f"{arg('properties', unknown[0] + '=' + properties[unknown[0]])}: {device} has "
                f"no property {unknown[0]!r} ({hint} see its SUPPORTED_PROPERTIES)"
            )
    # CACHE_DIR acts outside the compiled model (it creates a folder and writes a blob
    # there): the probe goes without it.
    probed = {k: v for k, v in properties.items() if k.upper() != "CACHE_DIR"}
    param = ov.opset13.parameter([1], ov.Type.f32)
    probe = ov.Model([ov.opset13.relu(param)], [param])
    try:
        compiled = core.compile_model(probe, device, probed)
    except RuntimeError as exc:
        raise DeviceError(_rejected(device, properties, exc)) from exc
    buffer = io.BytesIO()
    runtime = {k: v for k, v in probed.items() if k.upper() != "CACHE_MODE"}
    try:
        compiled.export_model(buffer)
        core.import_model(buffer, device, runtime)
    except RuntimeError as exc:
        raise DeviceError(_rejected(device, properties, exc, " at import")) from exc
    _CHECKED_PROPERTIES.add(memo)


def _rejected(
    device: str, properties: Mapping[str, str], exc: RuntimeError, where: str = ""
) -> str:
    names = ", ".join(sorted(properties))
    return (
        f"{device} rejects the compile properties ({names}){where}: "
        f"{openvino_message(exc).rstrip('.')}; fix or drop them from {arg('properties')}"
    )


def _read_identity(core: ov.Core, device: str) -> dict[str, str]:
    try:
        supported = set(core.get_property(device, "SUPPORTED_PROPERTIES"))
    except RuntimeError:
        return {}
    facts: dict[str, str] = {}
    requirements = _runtime_requirements(core, device)
    if requirements:
        facts["RUNTIME_REQUIREMENTS"] = requirements
    for name in IDENTITY_PROPERTIES:
        if name in supported:
            try:
                facts[name] = str(core.get_property(device, name))
            except RuntimeError:
                continue  # listed but not readable without hardware (offline NPU)
    return facts


_REQUIREMENTS_MEMO: dict[str, str] = {}


def _runtime_requirements(core: ov.Core, device: str) -> str:
    """What the device checks when it imports a blob (CPU: OpenVINO version and ISA).

    Only a compiled model reports it, so a one-op probe is compiled once per process
    (~50 ms on CPU). Devices that do not report it give "".
    """
    if device in _REQUIREMENTS_MEMO:
        return _REQUIREMENTS_MEMO[device]
    value = ""
    try:
        param = ov.opset13.parameter([1], ov.Type.f32)
        probe = core.compile_model(ov.Model([ov.opset13.relu(param)], [param]), device)
        if "RUNTIME_REQUIREMENTS" in probe.get_property("SUPPORTED_PROPERTIES"):
            value = str(probe.get_property("RUNTIME_REQUIREMENTS"))
    except RuntimeError:
        value = ""
    _REQUIREMENTS_MEMO[device] = value
    return value


def key_properties(device: str, properties: Mapping[str, str]) -> str:
    """The compile properties that can change a blob on ``device``, canonicalized."""
    neutral = blob_neutral_properties(device)
    return canonical_mapping((k, v) for k, v in properties.items() if k.upper() not in neutral)


# OPTIMIZATION_CAPABILITIES names -> INFERENCE_PRECISION_HINT values, in the order a
# positive control prefers them.
_LOWER_PRECISIONS: tuple[tuple[str, str], ...] = (("BF16", "bf16"), ("FP16", "f16"))


def choose_blob_control(capabilities: Sequence[str], default_precision: str) -> tuple[str, str]:
    """A compile property (name, value) that changes the exported blob, from what a
    device reports: its optimization capabilities and its current precision hint.

    A precision other than the default changes the compiled graph; a device that offers
    none (an AVX2-only CPU runs f32 and nothing else) gets ``CACHE_MODE=OPTIMIZE_SIZE``,
    which leaves the weights out of the blob on every device that exports weightless.
    """
    if default_precision.lower() not in ("f32", ""):
        return ("INFERENCE_PRECISION_HINT", "f32")
    for capability, hint in _LOWER_PRECISIONS:
        if capability in capabilities:
            return ("INFERENCE_PRECISION_HINT", hint)
    return ("CACHE_MODE", "OPTIMIZE_SIZE")


def blob_control(core: ov.Core, device: str) -> tuple[str, str]:
    """``choose_blob_control`` for ``device`` as this machine reports it: the positive
    control of blob-identity checks (a test that proves a difference is detectable)."""
    supported = set(core.get_property(device, "SUPPORTED_PROPERTIES"))
    capabilities: list[str] = []
    if "OPTIMIZATION_CAPABILITIES" in supported:
        capabilities = [str(c) for c in core.get_property(device, "OPTIMIZATION_CAPABILITIES")]
    default = ""
    if "INFERENCE_PRECISION_HINT" in supported:
        value = core.get_property(device, "INFERENCE_PRECISION_HINT")
        # An ov.Type on CPU ("f32"), plain text elsewhere.
        default = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
    return choose_blob_control(capabilities, default)


def compiler_version(core: ov.Core, facts: DeviceFacts) -> str:
    """The compiler/driver version text of a device, or what stands in for it."""
    versions = {k: v for k, v in facts.identity if "VERSION" in k}
    if versions:
        return canonical_mapping(versions.items())
    # CPU/GPU compile inside the plugin: its build number names the compiler.
    build = core.get_versions(facts.device).get(facts.device)
    return str(build.build_number) if build is not None else "unknown"
