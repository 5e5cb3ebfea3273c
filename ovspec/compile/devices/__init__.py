"""Device profiles: every per-device decision, one class per device family.

``profile_for(device, properties)`` picks the profile that claims the device (most
specific first: a profile may claim a device by its properties, not its name alone),
else the conservative fallback. The rest of ovspec asks the profile instead of
comparing device names (tests/test_layout.py enforces it); ``facts`` reads what
identifies a device's compiler for blob keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from ovspec.compile.devices.cpu import CpuProfile
from ovspec.compile.devices.npu import NpuProfile
from ovspec.compile.devices.npuw import NpuwProfile
from ovspec.compile.devices.profile import DeviceProfile, device_family

__all__ = ["PROFILES", "CpuProfile", "DeviceProfile", "NpuProfile", "NpuwProfile", "profile_for"]

# Asked in order: a profile that claims a device by its properties goes before the one
# that claims its family by name.
PROFILES: tuple[type[DeviceProfile], ...] = (CpuProfile, NpuwProfile, NpuProfile)


def profile_for(device: str, properties: Mapping[str, str] | None = None) -> DeviceProfile:
    """The profile of ``device`` compiled with ``properties``."""
    family = device_family(device)
    for profile in PROFILES:
        if profile.claims(family, properties or {}):
            return profile(device)
    return DeviceProfile(device)
