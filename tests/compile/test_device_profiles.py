"""Device profiles: which profile answers for a device, and what each one decides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import openvino as ov
import pytest

import ovspec.compile.devices as devices
from ovspec.compile.devices import CpuProfile, DeviceProfile, NpuProfile, profile_for
from ovspec.compile.devices.npu import NPU_BYPASS_UMD_CACHING
from ovspec.compile.devices.profile import ALWAYS_NEUTRAL
from ovspec.compile.modes import LoadMode
from ovspec.errors import DeviceError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import GraphRewrite, RewriteSet

PORTABLE = RewriteSet.parse("split-attention,last-position-logits")


@pytest.mark.parametrize(
    ("device", "profile"),
    [
        ("CPU", CpuProfile),
        ("cpu", CpuProfile),
        ("NPU", NpuProfile),
        ("NPU.0", NpuProfile),
        ("GPU", DeviceProfile),
        ("GPU.1", DeviceProfile),
        ("XPU", DeviceProfile),
    ],
)
def test_each_device_gets_its_familys_profile_or_the_fallback(
    device: str, profile: type[DeviceProfile]
) -> None:
    chosen = profile_for(device)
    assert type(chosen) is profile and chosen.device == device


def test_the_cpu_profile_compiles_from_the_ir_with_every_rewrite_but_the_npu_ones() -> None:
    cpu = profile_for("CPU")
    assert cpu.default_load_mode is LoadMode.PAGED and cpu.runs_paged_attention
    assert cpu.rung_load_mode is LoadMode.COMPILE  # where rung graphs are asked for
    assert cpu.default_rewrites.rewrites == RewriteSet.every().rewrites - {
        GraphRewrite.RESULT_GUARD,
        GraphRewrite.SHARED_HEAD,  # the NPU path's: CPU graphs stay as they were
        GraphRewrite.SHARED_EMBEDDING,
    }
    assert GraphRewrite.LIVE_STATE in cpu.default_rewrites
    assert dict(cpu.exact_properties) == EXACT_CPU_PROPERTIES
    assert cpu.halves_prompt_graph and cpu.trims_weight_pages
    assert cpu.warms_first_rung  # a static rung graph's first CPU inference packs weights
    assert {"ENABLE_CPU_PINNING", "NUM_STREAMS"} <= cpu.blob_neutral_properties
    # Pinning off unless asked; what the user asked is kept.
    assert cpu.loader_properties({}) == {"ENABLE_CPU_PINNING": "NO"}
    asked = {"ENABLE_CPU_PINNING": "YES", "PERF_COUNT": "YES"}
    assert cpu.loader_properties(asked) == asked
    assert cpu.trial_properties({}, frozenset({NPU_BYPASS_UMD_CACHING})) == {}


@pytest.mark.parametrize(
    ("device", "extra"),
    [
        (
            "NPU",
            {GraphRewrite.RESULT_GUARD, GraphRewrite.SHARED_HEAD, GraphRewrite.SHARED_EMBEDDING},
        ),
        ("GPU", set()),
    ],
)
def test_other_devices_take_blobs_the_portable_rewrites_and_nothing_measured(
    device: str, extra: set[GraphRewrite]
) -> None:
    """NPU adds the guard its NPUW partitioner needs (tests/compile/test_npuw.py) and
    one LM head and embedding for every graph (tests/compile/test_shared_head.py)."""
    profile = profile_for(device)
    assert profile.default_load_mode is LoadMode.IMPORT
    assert profile.default_rewrites.rewrites == PORTABLE.rewrites | extra
    assert dict(profile.exact_properties) == {}
    assert not profile.halves_prompt_graph and not profile.trims_weight_pages
    # The NPU's first rung is not warmed beside the prompt's run (docs/npu.md).
    assert profile.warms_first_rung is (device != "NPU")
    assert profile.blob_neutral_properties == ALWAYS_NEUTRAL
    assert profile.loader_properties({"A": "1"}) == {"A": "1"}


def test_a_timed_npu_compile_bypasses_the_driver_cache_where_the_device_has_one() -> None:
    npu = profile_for("NPU")
    with_cache = frozenset({NPU_BYPASS_UMD_CACHING})
    assert npu.trial_properties({}, with_cache) == {NPU_BYPASS_UMD_CACHING: "YES"}
    asked = {NPU_BYPASS_UMD_CACHING: "NO"}
    assert npu.trial_properties(asked, with_cache) == asked
    assert npu.trial_properties({}, frozenset()) == {}
    assert profile_for("GPU").trial_properties({}, with_cache) == {}


def test_an_absent_npu_compiles_offline_for_a_named_platform() -> None:
    if "NPU" in ov.Core().available_devices:
        pytest.skip("this machine has an NPU")
    facts = profile_for("NPU").resolve(ov.Core(), {"NPU_PLATFORM": "4000"})
    assert facts.offline and facts.device == "NPU"
    assert dict(facts.identity)["NPU_PLATFORM"] == "4000"
    # The fallback has no offline path: an absent GPU is refused, without the NPU hint.
    with pytest.raises(DeviceError, match="'GPU' is not available here") as refused:
        profile_for("GPU").resolve(ov.Core(), {"NPU_PLATFORM": "4000"})
    assert "NPU_PLATFORM" not in str(refused.value)


@dataclass(frozen=True)
class _ByProperty(DeviceProfile):
    """A profile that claims NPU devices compiled with one property (as the NPU plugin
    on CPU subdevices will)."""

    @classmethod
    def claims(cls, family: str, properties: Mapping[str, str]) -> bool:
        return family == "NPU" and properties.get("MARK") == "YES"


def test_a_profile_can_claim_a_device_by_its_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "PROFILES", (_ByProperty, *devices.PROFILES))
    assert type(profile_for("NPU", {"MARK": "YES"})) is _ByProperty
    assert type(profile_for("NPU", {"MARK": "NO"})) is NpuProfile
    assert type(profile_for("NPU")) is NpuProfile
