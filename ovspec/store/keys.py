"""Blob keys: an ordered list of named components, hashed with xxh3-128. A key names
every input that can change a blob and nothing else; ``explain`` names the components
two keys differ in ("why did this miss?").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import xxhash

log = logging.getLogger(__name__)

# Bump when the meaning of any component or the blob layout in the store changes.
# History: 1 — first format (2026-11). 2 — "transforms" names the graph rewrites that
# turn the IR into a specialization (2026-12): the IR file's digest alone cannot tell
# two versions of prepare() apart.
KEY_FORMAT_VERSION = 2

# The components every blob key carries, in hashing order.
COMPONENT_NAMES: tuple[str, ...] = (
    "format",
    "ir_structure",
    "weights",
    "compression",
    "transforms",
    "specialization",
    "device",
    "device_architecture",
    "openvino",
    "compiler",
    "properties",
    "patch",
)


@dataclass(frozen=True)
class KeyComponent:
    name: str
    value: str

    def __post_init__(self) -> None:
        if not self.name or "=" in self.name or "\n" in self.name:
            raise ValueError(f"bad key component name {self.name!r}")
        if "\n" in self.value:
            raise ValueError(f"key component {self.name} has a newline in its value")
        try:
            self.value.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate cannot be hashed as UTF-8
            raise ValueError(f"key component {self.name} is not valid text: {exc}") from None


@dataclass(frozen=True)
class BlobKey:
    """A content key. ``hex`` is xxh3-128 over ``name=value`` lines in order."""

    components: tuple[KeyComponent, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.components]
        if tuple(names) != COMPONENT_NAMES:
            raise ValueError(f"key components {names} differ from {list(COMPONENT_NAMES)}")

    @classmethod
    def from_values(cls, values: Mapping[str, str]) -> BlobKey:
        missing = [n for n in COMPONENT_NAMES if n not in values]
        extra = [n for n in values if n not in COMPONENT_NAMES]
        if missing or extra:
            raise ValueError(f"key components missing {missing}, unknown {extra}")
        key = cls(tuple(KeyComponent(n, values[n]) for n in COMPONENT_NAMES))
        for comp in key.components:
            log.debug("key %s component %s = %s", key.hex[:12], comp.name, comp.value)
        return key

    @property
    def hex(self) -> str:
        h = xxhash.xxh3_128()
        for comp in self.components:
            h.update(f"{comp.name}={comp.value}\n".encode())
        return h.hexdigest()

    def values(self) -> dict[str, str]:
        return {c.name: c.value for c in self.components}

    def value(self, name: str) -> str:
        return self.values()[name]


@dataclass(frozen=True)
class KeyDifference:
    name: str
    a: str
    b: str


def explain(a: Mapping[str, str], b: Mapping[str, str]) -> list[KeyDifference]:
    """Components whose values differ between two keys (given as name -> value)."""
    names = list(COMPONENT_NAMES) + sorted((set(a) | set(b)) - set(COMPONENT_NAMES))
    return [
        KeyDifference(n, a.get(n, "<absent>"), b.get(n, "<absent>"))
        for n in names
        if a.get(n) != b.get(n)
    ]


def canonical_mapping(items: Iterable[tuple[str, str]]) -> str:
    """One JSON text per mapping, sorted by key, whatever the input order."""
    return json.dumps(dict(sorted((str(k), str(v)) for k, v in items)), separators=(",", ":"))


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)
