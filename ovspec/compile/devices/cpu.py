"""OpenVINO's CPU plugin: graphs compiled from the IR, CPU-only rewrites, a measured
list of blob-neutral properties, exact-comparison properties and no thread pinning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from ovspec.compile.devices.profile import ALWAYS_NEUTRAL, DeviceProfile
from ovspec.compile.modes import LoadMode
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import GraphRewrite, RewriteSet

PINNING_PROPERTY = "ENABLE_CPU_PINNING"


@dataclass(frozen=True)
class CpuProfile(DeviceProfile):
    """The CPU plugin."""

    # One PagedAttention graph from the IR, attention over the live tokens only (what
    # genai runs by default; DESIGN s10.18). Rung graphs, where asked for, compile from
    # the IR: the plugin re-classifies an imported graph and drops its LLM treatment (f16
    # weights unpacked to f32: 2x the memory, ~1.6x the step).
    default_load_mode: ClassVar[LoadMode] = LoadMode.PAGED
    rung_load_mode: ClassVar[LoadMode] = LoadMode.COMPILE
    # The live-tokens state keeps f16 weights (the plugin does so only for a model with
    # an SDPA and a state variable); merged presents were measured to pay here only.
    default_rewrites: ClassVar[RewriteSet] = RewriteSet(
        frozenset(
            {
                GraphRewrite.SPLIT_ATTENTION,
                GraphRewrite.LAST_POSITION,
                GraphRewrite.LIVE_STATE,
                GraphRewrite.MERGED_PRESENTS,  # the result guard is NPUW's alone
            }
        )
    )
    # Scheduling and threading: measured not to change an export (tests compile with
    # each in a fresh process and compare the bytes).
    blob_neutral_properties: ClassVar[frozenset[str]] = ALWAYS_NEUTRAL | {
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
        PINNING_PROPERTY,
        "ENABLE_CPU_RESERVATION",
        "ENABLE_HYPER_THREADING",
        "SCHEDULING_CORE_TYPE",
        "PERFORMANCE_HINT",
        "PERFORMANCE_HINT_NUM_REQUESTS",
    }
    # The defaults quantize the stateful model's KV (u8) and activations; pin both.
    exact_properties: ClassVar[Mapping[str, str]] = MappingProxyType(EXACT_CPU_PROPERTIES)
    halves_prompt_graph: ClassVar[bool] = True
    runs_paged_attention: ClassVar[bool] = True
    perf_count_running_mean: ClassVar[bool] = True  # tests/bench/test_profile.py checks
    trims_weight_pages: ClassVar[bool] = True

    @classmethod
    def claims(cls, family: str, properties: Mapping[str, str]) -> bool:
        return family == "CPU"

    def loader_properties(self, properties: Mapping[str, str]) -> dict[str, str]:
        """Thread pinning off unless asked: with OpenVINO's default, a compile or import
        on the loader's thread while the decode thread infers leaves decoding pinned
        badly for the rest of the run (a third slower on 2 cores). Pinning cannot change
        a blob, so keys and stored blobs are unaffected."""
        props = self.required_properties(properties)
        props.setdefault(PINNING_PROPERTY, "NO")
        return props
