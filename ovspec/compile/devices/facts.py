"""What identifies a device's compiler, and which properties it takes.

Reads the read-only facts that name a device and its compiler/driver (architecture,
versions, what an imported blob requires) for blob keys, refuses properties the device
does not know or will not take before anything compiles, and picks a property that
changes a blob (the positive control of blob-identity checks). The per-device choices
built on these are in the device profiles beside this module.
"""

from __future__ import annotations

import difflib
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import openvino as ov

from ovspec.errors import DeviceError, arg, openvino_message
from ovspec.store.keys import canonical_mapping

# Read-only properties that identify what compiles the blob. Each is read only if the
# device lists it in SUPPORTED_PROPERTIES, so one list serves every device. CPU blobs
# also carry RUNTIME_REQUIREMENTS (OpenVINO version and ISA, checked at import), read
# from a compiled probe below.
IDENTITY_PROPERTIES: tuple[str, ...] = (
    "DEVICE_ARCHITECTURE",
    "FULL_DEVICE_NAME",
    "NPU_COMPILER_VERSION",
    "NPU_DRIVER_VERSION",
    "NPU_COMPILER_TYPE",
    "GPU_DEVICE_ID",
    "DEVICE_GOPS",
)

# Properties the OpenVINO core takes for any device (not in a plugin's
# SUPPORTED_PROPERTIES), and the ones ovspec itself passes.
CORE_PROPERTIES = frozenset(
    {"CACHE_DIR", "CACHE_MODE", "ENABLE_MMAP", "FORCE_TBB_TERMINATE", "WEIGHTS_PATH"}
    | {"ENABLE_WEIGHTLESS"}
)


@dataclass(frozen=True)
class DeviceFacts:
    """What identifies the compiler of a device, as text for keys and reports."""

    device: str
    identity: tuple[tuple[str, str], ...]
    offline: bool  # compiling for a device that is not present (NPU with NPU_PLATFORM)

    @property
    def architecture(self) -> str:
        return canonical_mapping(self.identity)


def is_available(core: ov.Core, device: str) -> bool:
    available = list(core.available_devices)
    return device in available or device.upper() in available


def absent_device_message(core: ov.Core, device: str, hint: str = "") -> str:
    available = ", ".join(core.available_devices)
    return f"device {device!r} is not available here (available: {available}){hint}"


def present_facts(core: ov.Core, device: str, properties: Mapping[str, str]) -> DeviceFacts:
    """The facts of a device that is here, once it has taken ``properties``."""
    check_properties(core, device, properties)
    return DeviceFacts(device, tuple(sorted(read_identity(core, device).items())), offline=False)


def _lists_none(_name: str) -> bool:
    return False


_CHECKED_PROPERTIES: set[tuple[str, tuple[tuple[str, str], ...]]] = set()


def check_properties(
    core: ov.Core,
    device: str,
    properties: Mapping[str, str],
    unlisted: Callable[[str], bool] = _lists_none,
) -> None:
    """Refuse properties the device does not know or will not take, before anything
    compiles (a bad value would otherwise pass ``build`` and fail at import).

    Names are checked against the device's SUPPORTED_PROPERTIES (``unlisted``: names the
    plugin takes without listing them); values by compiling, exporting and importing a
    one-op probe with them (~0.1 s, once per process and set of properties): the
    plugins check values only when a model is compiled.
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
        known = supported | CORE_PROPERTIES
        unknown = sorted(k for k in properties if k not in known and not unlisted(k))
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


def read_identity(core: ov.Core, device: str) -> dict[str, str]:
    """The identity properties ``device`` reports (and what its blobs require)."""
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


def canonical_key_properties(properties: Mapping[str, str], neutral: Iterable[str]) -> str:
    """``properties`` without the ``neutral`` ones, canonicalized for a blob key."""
    left_out = frozenset(neutral)
    return canonical_mapping((k, v) for k, v in properties.items() if k.upper() not in left_out)


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
    return choose_blob_control(capabilities, default_precision(core, device))


def default_precision(core: ov.Core, device: str) -> str:
    """The precision ``device`` computes in by default (its ``INFERENCE_PRECISION_HINT``,
    e.g. "f32" or "bf16"), or "" where it reports none."""
    if "INFERENCE_PRECISION_HINT" not in set(core.get_property(device, "SUPPORTED_PROPERTIES")):
        return ""
    value = core.get_property(device, "INFERENCE_PRECISION_HINT")
    # An ov.Type on CPU ("f32"), plain text elsewhere.
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def compiler_version(core: ov.Core, facts: DeviceFacts) -> str:
    """The compiler/driver version text of a device, or what stands in for it."""
    versions = {k: v for k, v in facts.identity if "VERSION" in k}
    if versions:
        return canonical_mapping(versions.items())
    # A plugin that compiles inside itself (CPU, GPU): its build number names the compiler.
    build = core.get_versions(facts.device).get(facts.device)
    return str(build.build_number) if build is not None else "unknown"
