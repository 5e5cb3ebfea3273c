"""An Intel NPU through the NPU plugin and its compiler: blobs through the store, the
portable rewrites with NPUW's result guard, offline compiles for an absent device with a
named platform, and no driver cache under a timed compile."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import openvino as ov

from ovspec.compile.devices.facts import DeviceFacts, absent_device_message, read_identity
from ovspec.compile.devices.profile import PORTABLE_REWRITES, DeviceProfile, device_family
from ovspec.errors import DeviceError, arg
from ovspec.ir.rewrites import GraphRewrite, RewriteSet

# Offline compiles (no device) need the plugin compiler and a named platform.
NPU_PLATFORM_PROPERTY = "NPU_PLATFORM"
# The driver keeps its own compiled-blob cache; a timed compile bypasses it.
NPU_BYPASS_UMD_CACHING = "NPU_BYPASS_UMD_CACHING"


@dataclass(frozen=True)
class NpuProfile(DeviceProfile):
    """The NPU plugin on NPU silicon, or compiling offline for a named platform."""

    # NPUW (how LLMs run on the NPU plugin) miscomputes a Result whose tensor also feeds
    # a later partition: each such Result gets its own identity. The LM head and the
    # embedding are models of their own shared by every graph (genai's
    # NPUW_LLM_SHARED_HEAD does the head): a ladder holds each once. Without the shared
    # embedding each rung's CPU subgraphs held an f32 copy of the table (~500 MiB per rung
    # of the 0.5B preset); with it NPUW's logits differ from the uncut graphs' by ~5e-6,
    # tokens equal (docs/npu.md).
    default_rewrites: ClassVar[RewriteSet] = RewriteSet(
        PORTABLE_REWRITES.rewrites
        | {GraphRewrite.RESULT_GUARD, GraphRewrite.SHARED_HEAD, GraphRewrite.SHARED_EMBEDDING}
    )
    # An inference beside the prompt's would share the device with it (on NPUW's CPU
    # subdevices, 2 shared cores: the first token came sooner without it, docs/npu.md).
    warms_first_rung: ClassVar[bool] = False

    @classmethod
    def claims(cls, family: str, properties: Mapping[str, str]) -> bool:
        return family == "NPU"

    def trial_properties(
        self, properties: Mapping[str, str], supported: frozenset[str]
    ) -> dict[str, str]:
        props = dict(properties)
        if NPU_BYPASS_UMD_CACHING in supported:
            props.setdefault(NPU_BYPASS_UMD_CACHING, "YES")
        return props

    def absent(self, core: ov.Core, properties: Mapping[str, str]) -> DeviceFacts:
        """Offline compile: the identity is the platform the user named plus the plugin
        compiler's version if it reports one."""
        family = device_family(self.device)
        if NPU_PLATFORM_PROPERTY in properties:
            identity = {NPU_PLATFORM_PROPERTY: properties[NPU_PLATFORM_PROPERTY]}
            identity.update(read_identity(core, family))
            return DeviceFacts(family, tuple(sorted(identity.items())), offline=True)
        hint = (
            "; offline NPU compiles need the NPU plugin compiler library (not in the pip "
            f"wheel) and {arg('properties', 'NPU_PLATFORM=4000')} (your platform) with "
            f"{arg('properties', 'NPU_COMPILER_TYPE=PLUGIN')}"
        )
        raise DeviceError(absent_device_message(core, self.device, hint))
