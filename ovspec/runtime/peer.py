"""openvino-genai's ``LLMPipeline`` as the peer: the precision settings its default graph
runs with on a device (the device's own defaults: genai passes none), and the ones where
a loader's graphs differ from it. Where none differ, greedy tokens are genai's
(``tests/runtime/test_peer.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import openvino as ov

from ovspec.compile.devices import profile_for
from ovspec.runtime.loader import Loader
from ovspec.runtime.paged import PagedLoader

# What can change the numbers a graph computes (threads and hints cannot).
PRECISION_PROPERTIES = (
    "INFERENCE_PRECISION_HINT",
    "EXECUTION_MODE_HINT",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    "KV_CACHE_PRECISION",
    "KEY_CACHE_PRECISION",
    "VALUE_CACHE_PRECISION",
    "KEY_CACHE_GROUP_SIZE",
    "VALUE_CACHE_GROUP_SIZE",
)
KV_PRECISION_PROPERTIES = ("KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION")
# Not a property: which attention graph runs (rung graphs are not genai's graph).
ATTENTION = "attention"
RUNG_ATTENTION = "static rung graphs"
PAGED_ATTENTION = "PagedAttention"


@dataclass(frozen=True)
class PropertyDifference:
    """One precision setting where ovspec's graph and genai's default graph differ."""

    name: str
    ovspec: str
    genai: str

    def as_json(self) -> dict[str, str]:
        return {"property": self.name, "ovspec": self.ovspec, "genai": self.genai}


def genai_defaults(device: str, core: ov.Core | None = None) -> dict[str, str]:
    """The precision settings genai's default pipeline compiles with on ``device``: what
    the device reports as its defaults (those it supports)."""
    core = core or ov.Core()
    supported = _supported(core.get_property(device, "SUPPORTED_PROPERTIES"))
    return {
        name: property_text(core.get_property(device, name))
        for name in PRECISION_PROPERTIES
        if name in supported
    }


def genai_differences(
    loader: Loader | PagedLoader, core: ov.Core | None = None
) -> tuple[PropertyDifference, ...]:
    """Where the loader's graphs differ from genai's default one on the same device.

    The paged graph is genai's default graph (the same transformation of the same IR,
    compiled with the properties given and nothing else): only precision properties the
    caller set can differ. Rung graphs are other graphs (static attention, the KV as
    graph inputs in the IR's own type): their attention and KV precision differ too.
    genai's side is the device's reported default for each property. Empty on a device
    whose genai pipeline is not the PagedAttention one (the NPU's is static).
    """
    if not profile_for(loader.device, loader.properties).runs_paged_attention:
        return ()
    core = core or ov.Core()
    theirs = genai_defaults(loader.device, core)
    asked = [name for name in PRECISION_PROPERTIES if name in loader.properties]
    found: list[PropertyDifference] = []
    if isinstance(loader, PagedLoader):
        ours = {n: property_text(v) for n, v in loader.compiled_properties(asked).items()}
    else:
        ours = _resolved(core, loader.device, loader.properties, asked)
        found.append(PropertyDifference(ATTENTION, RUNG_ATTENTION, PAGED_ATTENTION))
        kv_types = ",".join(sorted({r.element_type.get_type_name() for r in loader.roles().kv}))
        ours |= {name: kv_types for name in KV_PRECISION_PROPERTIES if name in theirs}
    found += [
        PropertyDifference(name, ours[name], theirs[name])
        for name in PRECISION_PROPERTIES
        if name in ours and name in theirs and ours[name] != theirs[name]
    ]
    return tuple(found)


def _resolved(
    core: ov.Core, device: str, properties: Mapping[str, str], names: list[str]
) -> dict[str, str]:
    """What a compile with ``properties`` resolves ``names`` to on ``device`` (the same
    spelling the device reports its defaults in)."""
    if not names:
        return {}
    probe = core.compile_model(_probe_model(), device, dict(properties))
    return {name: property_text(probe.get_property(name)) for name in names}


def property_text(value: object) -> str:
    """A property value as one spelling: element types by their short name (bf16, u8),
    enums by their member name."""
    if isinstance(value, ov.Type):
        return str(value.get_type_name())
    name = getattr(value, "name", None)
    if isinstance(name, str) and not isinstance(value, str):
        return name
    return str(value)


def _supported(value: object) -> set[str]:
    return set(value) if isinstance(value, (dict, list, tuple, set)) else set()


def _probe_model() -> ov.Model:
    """The smallest graph: it reports what a compile with given properties resolves to."""
    x = ov.opset13.parameter([1, 4], ov.Type.f32, name="x")
    y = ov.opset13.add(x, ov.opset13.constant(np.ones((1, 4), np.float32)))
    return ov.Model([y], [x], "ovspec-precision-probe")
