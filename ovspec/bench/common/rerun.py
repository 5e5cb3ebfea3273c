"""Per-case reruns of a benchmark whose results document holds several cases: the
fresh cases replace the saved ones of the same name, the rest are kept, and the
document lists every command its cases now come from (with that command's wall time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovspec.errors import BadRequestError


def sources(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The commands a results document's cases come from: ``command``, ``wall_s`` (the
    whole command's) and the ``cases`` it still supplies, in the order they ran."""
    saved: Sequence[Mapping[str, Any]] | None = document.get("sources")
    if saved:
        return [dict(s) for s in saved]
    return [
        {
            "command": document.get("command", ""),
            "wall_s": document["wall_s"],
            "cases": list(document.get("case_order") or sorted(document["cases"])),
        }
    ]


def merge_rerun(previous: Mapping[str, Any], fresh: Mapping[str, Any]) -> dict[str, Any]:
    """``previous`` with ``fresh``'s cases in place of its own of the same names (new
    ones after its order); refused when the two ran with different properties."""
    if dict(previous.get("properties", {})) != dict(fresh.get("properties", {})):
        raise BadRequestError(
            "the saved results ran with other properties "
            f"({previous.get('properties')} vs {fresh.get('properties')}): rerun every case"
        )
    replaced = set(fresh["cases"])
    kept = [
        {**source, "cases": [c for c in source["cases"] if c not in replaced]}
        for source in sources(previous)
    ]
    merged_sources = [s for s in kept if s["cases"]] + sources(fresh)
    cases = {**previous["cases"], **fresh["cases"]}
    old_order = list(previous.get("case_order") or sorted(previous["cases"]))
    order = old_order + [name for name in fresh["case_order"] if name not in old_order]
    return {
        **previous,
        "cases": cases,
        "case_order": order,
        "sources": merged_sources,
        "command": fresh.get("command", ""),
        "wall_s": sum(float(s["wall_s"]) for s in merged_sources),
    }
