"""Blob keys: named components, deterministic hashing, explanations of misses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovspec.store.keys import COMPONENT_NAMES, BlobKey, canonical_mapping, explain

# Key values are text OpenVINO and ovspec produce: no newlines, no lone surrogates.
VALUE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=20)


def values(**overrides: str) -> dict[str, str]:
    base = {name: f"v-{name}" for name in COMPONENT_NAMES}
    base.update(overrides)
    return base


@given(st.fixed_dictionaries({n: VALUE for n in COMPONENT_NAMES}))
def test_key_is_deterministic_and_128_bit(vals: dict[str, str]) -> None:
    a, b = BlobKey.from_values(vals), BlobKey.from_values(dict(reversed(list(vals.items()))))
    assert a.hex == b.hex
    assert len(a.hex) == 32


@given(st.sampled_from(COMPONENT_NAMES), VALUE)
def test_every_component_changes_the_key(name: str, other: str) -> None:
    base = values()
    if other == base[name]:
        return
    changed = values(**{name: other})
    assert BlobKey.from_values(base).hex != BlobKey.from_values(changed).hex
    assert [d.name for d in explain(base, changed)] == [name]


def test_component_boundaries_are_unambiguous() -> None:
    # "a" + "bc" must not hash like "ab" + "c".
    a = values(weights="a", compression="bc")
    b = values(weights="ab", compression="c")
    assert BlobKey.from_values(a).hex != BlobKey.from_values(b).hex


def test_missing_or_unknown_components_are_refused() -> None:
    partial = values()
    del partial["device"]
    with pytest.raises(ValueError, match="missing"):
        BlobKey.from_values(partial)
    with pytest.raises(ValueError, match="unknown"):
        BlobKey.from_values({**values(), "colour": "red"})


def test_explain_lists_differences_in_component_order() -> None:
    diffs = explain(
        values(device="NPU", openvino="2026.4"), values(device="CPU", openvino="2026.3")
    )
    assert [(d.name, d.a, d.b) for d in diffs] == [
        ("device", "NPU", "CPU"),
        ("openvino", "2026.4", "2026.3"),
    ]
    assert explain(values(), values()) == []


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=6))
def test_canonical_mapping_ignores_order(mapping: dict[str, str]) -> None:
    items = list(mapping.items())
    assert canonical_mapping(items) == canonical_mapping(reversed(items))
    assert "\n" not in canonical_mapping(items)


def test_a_value_that_is_not_utf8_text_is_refused() -> None:
    with pytest.raises(ValueError, match="not valid text"):
        BlobKey.from_values(values(device="\ud800"))
