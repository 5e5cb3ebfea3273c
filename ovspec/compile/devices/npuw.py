"""The NPU plugin with its NPUW partitioner compiling on CPU subdevices: the NPU path
on a machine without an NPU (``--device NPU --config NPUW_DEVICES=CPU``).

Claimed by its properties, not its name: an NPU device whose NPUW subdevices name no
NPU. ovspec completes the properties with ``NPU_USE_NPUW=YES``; the identity names the
plugin's NPUW mode and each subdevice's own identity, so its blobs never mix with a
real NPU's or the CPU plugin's. Its defaults are the first that run here; which NPUW
options to set, and what they cost, is still to be measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import openvino as ov

from ovspec.compile.devices.facts import (
    DeviceFacts,
    absent_device_message,
    check_properties,
    is_available,
    read_identity,
)
from ovspec.compile.devices.npu import NpuProfile
from ovspec.compile.devices.profile import device_family
from ovspec.errors import DeviceError, arg
from ovspec.ir.rewrites import GraphRewrite, RewriteSet

NPUW_DEVICES = "NPUW_DEVICES"
USE_NPUW = "NPU_USE_NPUW"
# The NPU plugin takes NPUW's options (and the switch) without listing them in
# SUPPORTED_PROPERTIES.
NPUW_PREFIX = "NPUW_"
PLUGIN_MODE = "NPU_PLUGIN_MODE"  # the identity entry that says what compiles the blob


def _npuw_option(name: str) -> bool:
    return name == USE_NPUW or name.startswith(NPUW_PREFIX)


def _subdevices(properties: Mapping[str, str]) -> list[str]:
    return [d.strip() for d in properties.get(NPUW_DEVICES, "").split(",") if d.strip()]


@dataclass(frozen=True)
class NpuwProfile(NpuProfile):
    """The NPU plugin's NPUW on host subdevices; an NPU profile in every other way
    (blobs through the store)."""

    # Split attention leaves NPUW's partitioned pipeline an f32 tensor where its CPU
    # subgraph wants f16 (its infer request refuses it): the last-position head only.
    default_rewrites: ClassVar[RewriteSet] = RewriteSet(frozenset({GraphRewrite.LAST_POSITION}))

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

    def resolve(self, core: ov.Core, properties: Mapping[str, str]) -> DeviceFacts:
        """The subdevices must be here; the NPU device need not be."""
        properties = self.required_properties(properties)
        subdevices = _subdevices(properties)
        for subdevice in subdevices:
            if not is_available(core, subdevice):
                raise DeviceError(absent_device_message(core, subdevice, f" ({NPUW_DEVICES})"))
        check_properties(core, self.device, properties, _npuw_option)
        identity = {PLUGIN_MODE: f"NPUW on {','.join(subdevices)} subdevices"}
        for subdevice in subdevices:
            identity.update(
                (f"{subdevice}:{name}", value)
                for name, value in read_identity(core, subdevice).items()
            )
        return DeviceFacts(self.device, tuple(sorted(identity.items())), offline=False)
