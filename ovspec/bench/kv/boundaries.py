"""The KV-layout benchmark: what a boundary costs and what the KV holds, remap against
copy-and-grow with and without pre-fault, side by side in one process.

Two parts. ``run_boundaries`` grows a cache shaped like the model's KV across a ladder
of boundaries, the arms in rotated order per repetition, next to a memcpy of the same
bytes into touched pages (the bandwidth a copy could reach). ``run_decode`` decodes one
token sequence through the real graphs with every arm at once, in lockstep: at each
token the arms step in a Williams order, so load drift hits them alike and per-band
step times pair up token by token. Figures only; nothing here asserts on time.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ovspec.errors import BadRequestError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kv import CopyAndGrowKV, KVCache, KVLayout, choose_layout, make_kv
from ovspec.runtime.kvcache import seq_slice
from ovspec.runtime.kvremap import RemapKV

REMAP = "remap"
COPY = "copy-and-grow"
PREFAULT = "copy-and-grow + pre-fault"
DIRECT = "direct (B0)"
MEMCPY = "memcpy"
GROW_ARMS = (REMAP, COPY, PREFAULT)
DECODE_ARMS = (DIRECT, COPY, PREFAULT, REMAP)


def check_remap_ladder(roles: ModelRoles, ladder: Ladder) -> None:
    """The ladders here must be ones remap can map (one line otherwise)."""
    if vmem.unsupported_reason() is not None:
        raise BadRequestError(
            f"the KV benchmark compares the remap layout, which cannot run here: "
            f"{vmem.unsupported_reason()}"
        )
    choose_layout(KVLayout.REMAP, roles, ladder)


# --------------------------------------------------------------------------- boundaries


@dataclass(frozen=True)
class BoundarySample:
    arm: str
    from_tokens: int
    to_tokens: int
    live_bytes: int
    seconds: float  # the whole grow() call (memcpy: the copy)
    copy_seconds: float  # Migration.copy_seconds: allocate/wait + copy (not the free)
    copied_bytes: int
    moved_bytes: int
    peak_physical_bytes: int | None  # only in the one untimed sample that measures it
    ahead_seconds: float  # built before the boundary: the pre-fault thread, remap's plan
    timed: bool = True  # False: the sample that read pagemap inside grow()


def _fill(kv: KVCache, tokens: int, pattern: np.ndarray) -> None:
    """Make ``tokens`` live as decoding leaves them: written in place, page by page."""
    for role in kv.roles.kv:
        view = kv.arrays()[role.past_input][seq_slice(role, 0, tokens)]
        view[...] = pattern.reshape(-1)[: view.size].reshape(view.shape)
    kv.live_tokens = tokens


def _grow_sample(
    arm: str, roles: ModelRoles, low: int, high: int, pattern: np.ndarray, measure: bool = False
) -> BoundarySample:
    layout = KVLayout.REMAP if arm == REMAP else KVLayout.COPY_AND_GROW
    kv = make_kv(layout, roles, low, high)
    kv.measure_physical = measure
    try:
        _fill(kv, low, pattern)
        ahead_s = 0.0
        if arm == PREFAULT:
            assert isinstance(kv, CopyAndGrowKV)
            kv.start_prefault(high)
            kv.wait_prefault()  # as at a boundary reached after an ample lead
            ahead_s = kv.prefaults[-1].seconds
        elif isinstance(kv, RemapKV):
            kv.prepare_growth(high)  # as a decode's first write on the rung does
            ahead_s = kv.prepared_seconds or 0.0
        began = time.perf_counter()
        migration = kv.grow(high)
        seconds = time.perf_counter() - began
    finally:
        kv.close()
    return BoundarySample(
        arm,
        low,
        high,
        roles.kv_bytes_per_token * low,
        seconds,
        migration.copy_seconds or migration.seconds,
        migration.copied_bytes,
        migration.moved_bytes,
        migration.peak_physical_bytes,
        ahead_s,
        timed=not measure,
    )


def _memcpy_sample(source: np.ndarray, low: int, high: int) -> BoundarySample:
    """A flat copy of the live bytes into pages already committed: memcpy speed."""
    live_bytes = source.nbytes
    region = vmem.Region(live_bytes)
    target = region.array(0, [live_bytes], np.dtype(np.uint8))
    vmem.populate_write([region.span])
    began = time.perf_counter()
    np.copyto(target, source)
    seconds = time.perf_counter() - began
    return BoundarySample(MEMCPY, low, high, live_bytes, seconds, seconds, live_bytes, 0, None, 0)


def run_boundaries(
    roles: ModelRoles, ladder: Ladder, repetitions: int, say: Callable[[str], None] = print
) -> list[BoundarySample]:
    """Every boundary of ``ladder`` x every arm x ``repetitions``, arms in rotated order."""
    check_remap_ladder(roles, ladder)
    longest = max(math.prod(r.shape(1, ladder.top_tokens)) for r in roles.kv)
    pattern = np.random.default_rng(0).standard_normal(longest).astype(np.float32)
    arms = (*GROW_ARMS, MEMCPY)
    samples: list[BoundarySample] = []
    for low, high in itertools.pairwise(ladder):
        say(f"boundary {low} -> {high}: {repetitions} x {len(arms)} arms")
        source = np.random.default_rng(low).integers(
            0, 255, roles.kv_bytes_per_token * low, np.uint8
        )
        for arm in GROW_ARMS:  # the physical peak, from one untimed sample each
            samples.append(_grow_sample(arm, roles, low, high, pattern, measure=True))
        for rep in range(repetitions):
            order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
            for arm in order:
                if arm == MEMCPY:
                    samples.append(_memcpy_sample(source, low, high))
                else:
                    samples.append(_grow_sample(arm, roles, low, high, pattern))
    return samples


def summarize_boundaries(samples: Sequence[BoundarySample]) -> list[dict[str, Any]]:
    """Median (and min-max) per boundary and arm."""
    rows = []
    keys = sorted({(s.from_tokens, s.to_tokens) for s in samples})
    for low, high in keys:
        for arm in (*GROW_ARMS, MEMCPY):
            every = [s for s in samples if (s.from_tokens, s.to_tokens, s.arm) == (low, high, arm)]
            mine = [s for s in every if s.timed]
            if not mine:
                continue
            seconds = [s.seconds for s in mine]
            copy_s = float(np.median([s.copy_seconds for s in mine]))
            copied = mine[0].copied_bytes
            peaks = [s.peak_physical_bytes for s in every if s.peak_physical_bytes is not None]
            rows.append(
                {
                    "from": low,
                    "to": high,
                    "arm": arm,
                    "live_bytes": mine[0].live_bytes,
                    "n": len(mine),
                    "median_s": float(np.median(seconds)),
                    "min_s": min(seconds),
                    "max_s": max(seconds),
                    "copy_median_s": copy_s,
                    "copied_bytes": copied,
                    "moved_bytes": mine[0].moved_bytes,
                    "copy_bytes_per_s": copied / copy_s if copied and copy_s > 0 else None,
                    "peak_physical_bytes": max(peaks) if peaks else None,
                    "ahead_median_s": float(np.median([s.ahead_seconds for s in mine])),
                }
            )
    return rows
