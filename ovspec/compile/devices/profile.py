"""The questions every device family answers, and the answers of a device without a
profile of its own (GPU, or any other): conservative ones, nothing measured assumed.

A ``DeviceProfile`` holds every per-device decision ovspec makes: the default load mode
and rewrites, which properties stay out of a blob key, the properties of an exact
comparison, of a loader and of each blob mode, how a model's graphs share its weights,
what a timed compile bypasses, whether the prompt graph is halved and the IR's weight
pages trimmed, and how the device's identity is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import openvino as ov

from ovspec.compile.devices.facts import (
    DeviceFacts,
    absent_device_message,
    canonical_key_properties,
    is_available,
    present_facts,
)
from ovspec.compile.modes import BlobMode, LoadMode, blob_compile_properties
from ovspec.errors import DeviceError
from ovspec.ir.rewrites import GraphRewrite, RewriteSet
from ovspec.ir.specialize import Specialization

# Neutral by construction on every device: profiling, logging and cache plumbing.
ALWAYS_NEUTRAL = frozenset({"PERF_COUNT", "LOG_LEVEL", "CACHE_DIR"})

# Plain opset ops that every device takes.
PORTABLE_REWRITES = RewriteSet(
    frozenset({GraphRewrite.SPLIT_ATTENTION, GraphRewrite.LAST_POSITION})
)


def device_family(device: str) -> str:
    """``NPU.0`` -> ``NPU``; ``cpu`` -> ``CPU``."""
    return device.split(".", 1)[0].upper()


@dataclass(frozen=True)
class DeviceProfile:
    """Every per-device decision, for ``device`` as the user named it (``NPU.0``).

    Subclasses override the class-level answers and the methods; this class itself is
    the fallback for devices no profile claims.
    """

    device: str

    # Graphs come from the store as blobs: what every device can do. ``rung_load_mode``
    # is the default where rung graphs are asked for (a KV layout, compression, the
    # rewrites, work that measures rungs): the same here.
    default_load_mode: ClassVar[LoadMode] = LoadMode.IMPORT
    rung_load_mode: ClassVar[LoadMode] = LoadMode.IMPORT
    default_rewrites: ClassVar[RewriteSet] = PORTABLE_REWRITES
    # Left out of blob keys: anything not listed is in the key (an unknown property
    # costs a recompile, never a wrong blob).
    blob_neutral_properties: ClassVar[frozenset[str]] = ALWAYS_NEUTRAL
    # Properties that make the static graphs and the stateful model compute alike.
    exact_properties: ClassVar[Mapping[str, str]] = MappingProxyType({})
    # Compile the graph a prompt waits for as two halves on two cores (a device where a
    # compile is one thread, measured to pay there).
    halves_prompt_graph: ClassVar[bool] = False
    # Keep the IR's mapped weights out of the resident set once graphs packed their own
    # copy (a device whose compiled graphs hold the weights in host memory).
    trims_weight_pages: ClassVar[bool] = False
    # Warm a request's first rung with one inference as it loads, beside the prompt's
    # run (False: its first decode step pays that, and the prompt has the device alone).
    warms_first_rung: ClassVar[bool] = True
    # Runs OpenVINO's PagedAttention op (the paged load mode).
    runs_paged_attention: ClassVar[bool] = False
    # PERF_COUNT's per-node times are the mean over every call of the request (not the
    # last call's); unknown elsewhere, so read as given.
    perf_count_running_mean: ClassVar[bool] = False
    # Bytes of an export that differ between identical compiles, as (start, end) counted
    # back from the blob's end; a blob-identity check reads them as zeros.
    volatile_blob_tail: ClassVar[tuple[int, int] | None] = None

    @classmethod
    def claims(cls, family: str, properties: Mapping[str, str]) -> bool:
        """Whether this profile answers for a device of ``family`` compiled with
        ``properties`` (the fallback claims nothing: it is what is left)."""
        return False

    def required_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        """The properties every compile and import on this device takes: the user's,
        with what the device mode they chose needs (in keys too)."""
        return dict(properties)

    def loader_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        """The properties a loader compiles and imports with: the required ones, with
        what a loader's second thread needs (never blob-changing)."""
        return self.required_properties(properties)

    def trial_properties(
        self, properties: Mapping[str, str], supported: frozenset[str]
    ) -> dict[str, str]:
        """The properties of a timed compile in a fresh process (``compile/worker.py``),
        given the property names the device supports: caches that would make it a load
        are bypassed."""
        return dict(properties)

    def exports_inside_compile(self, mode: BlobMode, properties: Mapping[str, str]) -> bool:
        """Whether to compile a graph to be exported with a throwaway ``CACHE_DIR``, so that
        OpenVINO exports inside ``compile_model`` (which releases the GIL) and the export
        proper is cheap: only where that cache holds no weights and an export is slow."""
        return False

    def blob_properties(self, mode: BlobMode, properties: Mapping[str, str]) -> dict[str, str]:
        """The compile properties (beyond ``properties``, which win) that make the device
        export a blob of ``mode``; in keys, as they change the blob."""
        return blob_compile_properties(mode)

    def graph_properties(
        self, spec: Specialization, properties: Mapping[str, str]
    ) -> dict[str, str]:
        """Compile properties of one specialization's graph beyond ``properties`` (its
        blob's compile properties); in that graph's key (none, for most devices)."""
        return {}

    def part_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        """Compile properties of the LM head and embedding models the cut graphs share
        (``ir/headcut.py``) beyond ``properties``; in their keys."""
        return {}

    def shared_weights_properties(self, weights_digest: str) -> dict[str, str]:
        """Compile properties that let the graphs of one model share one copy of its
        weights in a process, given the digest of its weights (none, for most devices)."""
        return {}

    def compile_properties(
        self, mode: BlobMode, properties: Mapping[str, str], weights_digest: str
    ) -> dict[str, str]:
        """What a blob compiles with: the blob mode's properties over the user's, over the
        shared-weights ones (from the weights' digest: they never split keys the
        ``weights`` component does not)."""
        return {
            **self.shared_weights_properties(weights_digest),
            **properties,
            **self.blob_properties(mode, properties),
        }

    def configure_core(self, core: ov.Core, properties: Mapping[str, str]) -> None:
        """Set on the Core that compiles and imports what the device does not take from
        a compile or import config (nothing, for most devices)."""

    def configure_loader_core(self, core: ov.Core, properties: Mapping[str, str]) -> None:
        """Set on a loader's Core (one that imports beside a decode in its process, no
        device/host split) what the device takes Core-wide only (nothing, for most)."""

    def key_properties(self, properties: Mapping[str, str]) -> str:
        """The compile properties that can change a blob on this device, canonicalized."""
        return canonical_key_properties(properties, self.blob_neutral_properties)

    def resolve(self, core: ov.Core, properties: Mapping[str, str]) -> DeviceFacts:
        """Check the device can compile here with ``properties``; read the facts that go
        into a blob key."""
        if is_available(core, self.device):
            return present_facts(core, self.device, properties)
        return self.absent(core, properties)

    def absent(self, core: ov.Core, properties: Mapping[str, str]) -> DeviceFacts:
        """The device is not here: refused, unless the profile compiles without it."""
        raise DeviceError(absent_device_message(core, self.device))
