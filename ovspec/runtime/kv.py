"""KV layouts, registered: which layout a sequence gets, and making it.

Each layout is a ``KVCache`` in a module of its own (``kvgrow`` copy-and-grow,
``kvshared`` shared-max, ``kvremap`` remap) and says whether it can hold a model's KV
over a ladder, and why not. ``choose_layout`` asks them in the registry's order: the
first default layout that fits, or the one asked for (a platform that lacks it fails
over, with a note; a ladder it cannot take is refused). All hand OpenVINO tensors that
share memory with their arrays, so a decode step never copies the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovspec.errors import LadderError, OvspecError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime.kvcache import (
    KVCache,
    KVLayout,
    KVLayoutWarning,
    KVSample,
    KVTrace,
    Migration,
    Prefault,
    Unsupported,
)
from ovspec.runtime.kvgrow import CopyAndGrowKV
from ovspec.runtime.kvremap import RemapKV
from ovspec.runtime.kvshared import SharedMaxKV

__all__ = [
    "LAYOUTS",
    "CopyAndGrowKV",
    "KVCache",
    "KVLayout",
    "KVLayoutWarning",
    "KVSample",
    "KVTrace",
    "LayoutChoice",
    "Migration",
    "Prefault",
    "RemapKV",
    "SharedMaxKV",
    "Unsupported",
    "choose_layout",
    "layout_class",
    "make_kv",
]

# Every layout, in the order a sequence that names none prefers them.
LAYOUTS: tuple[type[KVCache], ...] = (RemapKV, CopyAndGrowKV, SharedMaxKV)


def layout_class(layout: KVLayout) -> type[KVCache]:
    for cls in LAYOUTS:
        if cls.layout is layout:
            return cls
    raise OvspecError(f"no KV layout registered as {layout.value!r}")


@dataclass(frozen=True)
class LayoutChoice:
    """The layout a sequence gets, and why when it is not the one asked for."""

    layout: KVLayout
    note: str = ""  # empty when the request was honoured as asked
    failover: bool = False  # a layout was asked for explicitly and cannot run here


def choose_layout(requested: KVLayout | None, roles: ModelRoles, ladder: Ladder) -> LayoutChoice:
    """``requested`` None is the default: the first default layout that fits (remap
    where it works, else copy-and-grow), the note saying why each earlier one did not.

    An explicit layout the platform cannot run fails over to the default
    (``failover``: the caller warns); one that cannot take this model or ladder is
    refused (its one-line error, e.g. remap's naming the nearest aligned capacities).
    """
    if requested is None:
        return _first_fit(roles, ladder, skipped=[])
    cls = layout_class(requested)
    why = cls.unsupported(roles, ladder)
    if why is None:
        return LayoutChoice(requested)
    if not why.platform:
        cls.refuse(roles, ladder)
        raise LadderError(f"{why.reason}; choose another KV layout")  # if refuse() did not
    fallback = _first_fit(roles, ladder, skipped=[why], leave_out=requested)
    return LayoutChoice(fallback.layout, fallback.note, failover=True)


def _first_fit(
    roles: ModelRoles,
    ladder: Ladder,
    skipped: list[Unsupported],
    leave_out: KVLayout | None = None,
) -> LayoutChoice:
    for cls in LAYOUTS:
        if not cls.chosen_by_default or cls.layout is leave_out:
            continue
        why = cls.unsupported(roles, ladder)
        if why is None:
            reasons = [s.reason for s in skipped]
            note = "; ".join([*reasons, f"using {cls.layout.value}"]) if reasons else ""
            return LayoutChoice(cls.layout, note)
        skipped.append(why)
    raise OvspecError("no KV layout can hold this model's KV over this ladder")


def make_kv(
    layout: KVLayout,
    roles: ModelRoles,
    capacity_tokens: int,
    max_capacity_tokens: int,
    prefault: Prefault | None = None,
    ladder: Ladder | None = None,
) -> KVCache:
    """The KV cache of ``layout``. ``ladder`` lets the remap layout build each growth
    ahead of its boundary (see ``RemapKV.prepare_growth``); ``prefault`` is
    copy-and-grow's."""
    return layout_class(layout).create(
        roles, capacity_tokens, max_capacity_tokens, ladder=ladder, prefault=prefault
    )
