"""The NPU plugin with its NPUW partitioner compiling on CPU subdevices: the NPU path
on a machine without an NPU (``--device NPU --config NPUW_DEVICES=CPU``).

Claimed by its properties, not its name: an NPU device whose NPUW subdevices name no
NPU. ovspec completes the properties with ``NPU_USE_NPUW=YES``; the identity names the
plugin's NPUW mode and each subdevice's own identity, so its blobs never mix with a
real NPU's or the CPU plugin's. NPUW passes every other property its subdevices take
on to them at compile, but not at import: the compiler's Core carries them there.
Weightless blobs fold every subgraph into functions (NPUW keeps weights out of its export
only then), so a ladder stores its weights once; a model's graphs name one weights bank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import openvino as ov

from ovspec.compile.devices.cpu import PINNING_PROPERTY
from ovspec.compile.devices.facts import (
    DeviceFacts,
    absent_device_message,
    check_properties,
    is_available,
    read_identity,
)
from ovspec.compile.devices.npu import NpuProfile
from ovspec.compile.devices.profile import device_family
from ovspec.compile.modes import BlobMode, blob_compile_properties
from ovspec.errors import DeviceError, arg
from ovspec.ir.specialize import Phase, Specialization

NPUW_DEVICES = "NPUW_DEVICES"
USE_NPUW = "NPU_USE_NPUW"
# The NPU plugin takes NPUW's options (and the switch) without listing them in
# SUPPORTED_PROPERTIES.
NPUW_PREFIX = "NPUW_"
PLUGIN_MODE = "NPU_PLUGIN_MODE"  # the identity entry that says what compiles the blob
# NPUW exports weightless only with folding on (its can_use_weightless_flow); folding
# alone fails on builtin:small ("unordered_map::at") and folds nothing with 2 layers:
# every subgraph as a function (FUNCALL_FOR_ALL) works on both.
FOLD = "NPUW_FOLD"
FUNCALL_FOR_ALL = "NPUW_FUNCALL_FOR_ALL"
ENABLE_WEIGHTLESS = "ENABLE_WEIGHTLESS"
# Compiled models naming one bank may share its tensors in a process (NPUW matches them
# by address: not reproducible across imports here, docs/npu.md); the name is written
# into the blob, and an import joins the bank the blob names.
WEIGHTS_BANK = "NPUW_WEIGHTS_BANK"
# One partition (genai's BEST_PERF generate graph): on CPU subdevices a prompt graph
# compiles in about half the time and its prompt runs 2-3x faster (docs/npu.md).
ONLINE_PIPELINE = "NPUW_ONLINE_PIPELINE"


def _npuw_option(name: str) -> bool:
    return name == USE_NPUW or name.startswith(NPUW_PREFIX)


def _subdevices(properties: Mapping[str, str]) -> list[str]:
    return [d.strip() for d in properties.get(NPUW_DEVICES, "").split(",") if d.strip()]


@dataclass(frozen=True)
class NpuwProfile(NpuProfile):
    """The NPU plugin's NPUW on host subdevices; an NPU profile in every other way
    (blobs through the store)."""

    # f32 on the subdevice (the CPU's default may be bf16) and f32 links between NPUW's
    # partitions: within 1e-5 of the CPU plugin's logits (NPUW_ONLINE_PIPELINE=NONE,
    # one partition, makes them equal). No folding: it stores f32 weights as f16
    # (a logit gap of 2e-3 on tests/data/qwen2), so exact blobs carry their weights.
    exact_properties: ClassVar[Mapping[str, str]] = MappingProxyType(
        {"NPUW_F16IC": "NO", "INFERENCE_PRECISION_HINT": "f32", FOLD: "NO"}
    )

    # A random 32-character token 40 bytes before the end of every NPUW export (measured
    # across fresh processes; all else is byte-identical).
    volatile_blob_tail: ClassVar[tuple[int, int] | None] = (40, 8)
    # Subgraphs on host subdevices hold their weights in host memory; a compile and its
    # export map the whole .bin in (~1 GiB on the 0.5B preset), read again only by the
    # next rung's compile and, a few rows a token, the host embedding lookup (a dropped
    # page faults back in).
    trims_weight_pages: ClassVar[bool] = True

    @classmethod
    def claims(cls, family: str, properties: Mapping[str, str]) -> bool:
        subdevices = _subdevices(properties)
        return (
            family == "NPU"
            and bool(subdevices)
            and all(device_family(d) != "NPU" for d in subdevices)
        )

    def required_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        if properties.get(USE_NPUW, "YES").upper() not in ("YES", "TRUE", "1"):
            raise DeviceError(
                f"{arg('properties', NPUW_DEVICES + '=' + properties[NPUW_DEVICES])} runs the "
                f"NPU plugin's NPUW, which {USE_NPUW}={properties[USE_NPUW]} turns off; drop one"
            )
        return {**properties, USE_NPUW: "YES"}

    def trial_properties(
        self, properties: Mapping[str, str], supported: frozenset[str]
    ) -> dict[str, str]:
        return dict(properties)  # no NPU driver, so no driver cache to bypass

    def blob_properties(self, mode: BlobMode, properties: Mapping[str, str]) -> dict[str, str]:
        """Weightless: fold, unless the user chose; full: say so, as NPUW exports a folded
        model weightless unless told otherwise."""
        if mode is BlobMode.FULL:
            return {ENABLE_WEIGHTLESS: "NO"}
        props = blob_compile_properties(mode)
        if FOLD not in properties:
            props.update({FOLD: "YES", FUNCALL_FOR_ALL: "YES"})
        return props

    def exports_inside_compile(self, mode: BlobMode, properties: Mapping[str, str]) -> bool:
        """A folded weightless blob: its export evaluates the weights into the bank, ~1 s
        on the 0.5B preset with the GIL held by the Python binding (docs/npu.md)."""
        return mode is BlobMode.WEIGHTLESS and not _unfolded(properties)

    def graph_properties(
        self, spec: Specialization, properties: Mapping[str, str]
    ) -> dict[str, str]:
        """A prompt graph that does not fold is one partition, unless the user chose: the
        step graphs keep NPUW's partitions (one partition made ovspec's steps 3x slower
        in a one-ahead run, unexplained: docs/npu.md); folding needs the partitions."""
        prompt = spec.phase is Phase.PREFILL
        if prompt and _unfolded(properties) and ONLINE_PIPELINE not in properties:
            return {ONLINE_PIPELINE: "NONE"}
        return {}

    def part_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        """The shared head and embedding are one partition each, unless the user chose
        (as genai's shared head): NPUW's partitioner refuses a lone embedding lookup."""
        return {} if ONLINE_PIPELINE in properties else {ONLINE_PIPELINE: "NONE"}

    def compile_properties(
        self, mode: BlobMode, properties: Mapping[str, str], weights_digest: str
    ) -> dict[str, str]:
        """The base's, but a blob that carries its weights (full, or unfolded: NPUW then
        serializes its bank into the blob) names no shared bank unless the user chose one:
        imported beside a live bank of that name, its tensors' ids would collide with the
        bank's (NPUW asserts). Only weightless folded blobs, which read the .bin, share."""
        props = super().compile_properties(mode, properties, weights_digest)
        if (mode is BlobMode.FULL or _unfolded(props)) and WEIGHTS_BANK not in properties:
            del props[WEIGHTS_BANK]
        return props

    def shared_weights_properties(self, weights_digest: str) -> dict[str, str]:
        """One bank per weights file: a bank tells its tensors apart only by what tells them
        apart within one model (address or .bin offset, type, shape), so two models must
        never share a name; the digest keeps them apart."""
        return {WEIGHTS_BANK: f"ovspec-{weights_digest[:16]}"}

    def subdevice_properties(
        self, core: ov.Core, subdevice: str, properties: Mapping[str, str]
    ) -> dict[str, str]:
        """The properties NPUW hands on to ``subdevice``: those it lists."""
        listed = {str(p) for p in core.get_property(subdevice, "SUPPORTED_PROPERTIES")}
        return {k: v for k, v in properties.items() if k in listed and not _npuw_option(k)}

    def configure_core(self, core: ov.Core, properties: Mapping[str, str]) -> None:
        """NPUW imports its subgraphs with the subdevice's Core-wide settings only (on a
        CPU with bf16, an f32 blob would come back bf16): set them there."""
        for subdevice in _subdevices(properties):
            forwarded = self.subdevice_properties(core, subdevice, properties)
            if forwarded:
                core.set_property(subdevice, forwarded)

    def configure_loader_core(self, core: ov.Core, properties: Mapping[str, str]) -> None:
        """CPU subdevices' thread pinning off unless asked, as the CPU profile's loader has
        it: pinned, each import makes stream threads pinned to every core, the decode's
        among them, whose work competes with the decode while it runs; unpinned they take
        the importing thread's cores (docs/npu.md). Core-wide, not in the compile config:
        NPUW writes that into its export, so the blob and its key stay as they were."""
        for subdevice in _subdevices(properties):
            if device_family(subdevice) == "CPU" and PINNING_PROPERTY not in properties:
                core.set_property(subdevice, {PINNING_PROPERTY: "NO"})

    def resolve(self, core: ov.Core, properties: Mapping[str, str]) -> DeviceFacts:
        """The subdevices must be here; the NPU device need not be."""
        properties = self.required_properties(properties)
        subdevices = _subdevices(properties)
        for subdevice in subdevices:
            if not is_available(core, subdevice):
                raise DeviceError(absent_device_message(core, subdevice, f" ({NPUW_DEVICES})"))
        forwarded = {
            name for d in subdevices for name in self.subdevice_properties(core, d, properties)
        }
        check_properties(core, self.device, properties, lambda k: _npuw_option(k) or k in forwarded)
        identity = {PLUGIN_MODE: f"NPUW on {','.join(subdevices)} subdevices"}
        for subdevice in subdevices:
            identity.update(
                (f"{subdevice}:{name}", value)
                for name, value in read_identity(core, subdevice).items()
            )
        return DeviceFacts(self.device, tuple(sorted(identity.items())), offline=False)


def _unfolded(properties: Mapping[str, str]) -> bool:
    """Whether ``properties`` turn NPUW's folding off."""
    return properties.get(FOLD, "").upper() in ("NO", "FALSE")
