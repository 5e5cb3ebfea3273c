"""The figures one protocol run reports, computed from what the runtime recorded.

Pure arithmetic over a ``DecodeResult``: foreground compile wall, critical path,
decode time and tokens/s per context band, boundary waits and migrations, reserved
(virtual) and physical (committed) KV, time- and token-weighted, and their peaks. The
names are the seed write-up's (docs/DESIGN.md defines them).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ovspec.ladder import Ladder
from ovspec.runtime.decoding import DecodeResult
from ovspec.runtime.loader import EventKind, LoaderEvent


@dataclass(frozen=True)
class BoundaryFigures:
    from_capacity_tokens: int
    to_capacity_tokens: int
    at_live_tokens: int
    wait_s: float  # blocked at the boundary for the new rung's graph
    deadline_met: bool  # the graph was ready (loaded in the background, no wait)
    loaded_in_background: bool
    migration_s: float
    copied_bytes: int
    allocated_bytes: int
    peak_reserved_bytes: int
    moved_bytes: int = 0  # pages remapped (no copy)
    peak_physical_bytes: int | None = None
    boundary_at_s: float = 0.0  # decode reached the boundary (since the loader opened)
    ready_at_s: float = 0.0  # the new rung's decode graph was loaded (same clock)

    @property
    def slack_s(self) -> float:
        """Measured slack: boundary minus ready (the plan's ``slack_s``, measured)."""
        return self.boundary_at_s - self.ready_at_s

    @property
    def migration_bytes_per_s(self) -> float:
        return self.copied_bytes / self.migration_s if self.migration_s > 0 else 0.0


@dataclass(frozen=True)
class BandFigures:
    band: str  # e.g. "0-1024"
    low_tokens: int
    high_tokens: int
    steps: int
    infer_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.steps / self.infer_s if self.infer_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.infer_s / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class RunFigures:
    """Everything one run reports; JSON round-trips through ``to_json``/``from_json``."""

    protocol: str
    variant: str  # "cold" or "warm" store
    repetition: int
    foreground_s: float  # start -> the first rung's graphs are ready (compile wall)
    time_to_first_token_s: float  # start -> prompt processed
    critical_path_s: float  # start -> last token
    first_rung_compile_s: float  # compile + import of the first rung's graphs
    prefill_s: float
    decode_s: float  # sum of decode-step inference time
    decode_tokens: int
    compile_foreground_s: float
    compile_background_s: float
    store_hits: int
    boundaries: tuple[BoundaryFigures, ...]
    bands: tuple[BandFigures, ...]
    reserved_kv_time_weighted_bytes: float
    peak_kv_bytes: int
    peak_rss_bytes: int
    kv_bytes_per_token: int
    weights_bytes: int
    kv_layout: str = ""  # the layout the run used (I3 falls back where remap cannot run)
    reserved_kv_token_weighted_bytes: float = 0.0
    physical_kv_time_weighted_bytes: float | None = None
    physical_kv_token_weighted_bytes: float | None = None
    peak_physical_kv_bytes: int | None = None  # samples and boundary peaks
    # The write-up's definition: reserved KV averaged over time from the loader's
    # opening to the last token, foreground included (nothing is reserved before the
    # first rung's KV is allocated).
    reserved_kv_open_to_last_bytes: float = 0.0
    split: str = ""  # "device cores 0, host cores 1", or "shared" (no split)
    load_mode: str = ""  # how every graph loaded: import (through the store) or compile
    # label -> seconds to have that graph ready: the build (the host's whole build under
    # the split; compile + export otherwise) plus the import and warm-up.
    ready_cost_s: dict[str, float] = field(default_factory=dict)
    first_rung_wall_s: float = 0.0  # origin -> every graph of the first rung loaded
    compile_s_by_graph: dict[str, float] = field(default_factory=dict)  # compile only

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["boundaries"] = [
            {**asdict(b), "migration_bytes_per_s": b.migration_bytes_per_s, "slack_s": b.slack_s}
            for b in self.boundaries
        ]
        out["bands"] = [
            {**asdict(b), "tokens_per_s": b.tokens_per_s, "step_ms": b.step_ms} for b in self.bands
        ]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunFigures:
        fields = dict(data)
        fields["boundaries"] = tuple(
            BoundaryFigures(
                **{k: v for k, v in b.items() if k not in ("migration_bytes_per_s", "slack_s")}
            )
            for b in data["boundaries"]
        )
        fields["bands"] = tuple(
            BandFigures(**{k: v for k, v in b.items() if k not in ("tokens_per_s", "step_ms")})
            for b in data["bands"]
        )
        return cls(**fields)

    @property
    def deadlines_met(self) -> tuple[int, int]:
        """(met, total) over boundaries whose graph had to come from the background."""
        relevant = [b for b in self.boundaries if b.loaded_in_background]
        return sum(b.deadline_met for b in relevant), len(relevant)

    @property
    def boundary_wait_s(self) -> float:
        return sum(b.wait_s for b in self.boundaries)

    @property
    def migration_total_s(self) -> float:
        return sum(b.migration_s for b in self.boundaries)

    @property
    def migration_per_boundary_s(self) -> float:
        return self.migration_total_s / len(self.boundaries) if self.boundaries else 0.0

    @property
    def migration_per_token_s(self) -> float:
        """Migration amortized over the run's decoded tokens."""
        return self.migration_total_s / self.decode_tokens if self.decode_tokens else 0.0


def band_edges(ladder: Ladder) -> list[tuple[int, int]]:
    """Context bands by rung: [0, C0), [C0, C1), ... in KV positions."""
    edges = [0, *ladder]
    return list(itertools.pairwise(edges))


def compute(
    result: DecodeResult,
    protocol: str,
    variant: str,
    repetition: int,
    bands_ladder: Ladder,
    peak_rss_bytes: int,
    kv_bytes_per_token: int,
    weights_bytes: int,
    split: str = "",
    load_mode: str = "",
) -> RunFigures:
    decode_steps = [s for s in result.steps if not s.prefill]
    prefill_steps = [s for s in result.steps if s.prefill]
    events = result.events
    loaded = [e for e in events if e.kind in (EventKind.COMPILED, EventKind.STORE_HIT)]
    imports = [e for e in events if e.kind is EventKind.LOADED]
    return RunFigures(
        protocol=protocol,
        variant=variant,
        repetition=repetition,
        foreground_s=result.ready_s,
        time_to_first_token_s=result.first_token_s,
        critical_path_s=result.finished_s,
        first_rung_compile_s=sum(
            e.seconds
            for e in events
            if e.kind in (EventKind.COMPILED, EventKind.LOADED)
            and e.spec.split("@")[1].split("x")[0] == str(result.rungs[0])
        ),
        prefill_s=sum(s.infer_s for s in prefill_steps),
        decode_s=sum(s.infer_s for s in decode_steps),
        decode_tokens=len(decode_steps),
        compile_foreground_s=sum(
            e.seconds
            for e in [*loaded, *imports]
            if e.foreground and e.kind is not EventKind.STORE_HIT
        ),
        compile_background_s=sum(
            e.seconds
            for e in [*loaded, *imports]
            if not e.foreground and e.kind is not EventKind.STORE_HIT
        ),
        store_hits=sum(e.kind is EventKind.STORE_HIT for e in events),
        boundaries=boundary_figures(result),
        bands=band_figures(result, bands_ladder),
        reserved_kv_time_weighted_bytes=time_weighted_reserved(result),
        reserved_kv_token_weighted_bytes=token_weighted(result, physical=False) or 0.0,
        physical_kv_time_weighted_bytes=time_weighted_physical(result),
        physical_kv_token_weighted_bytes=token_weighted(result, physical=True),
        peak_physical_kv_bytes=peak_physical(result),
        kv_layout=result.kv_layout,
        peak_kv_bytes=max(
            [r for _, r in result.reserved_kv]
            + [b.migration.peak_reserved_bytes for b in result.boundaries]
        ),
        peak_rss_bytes=peak_rss_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        weights_bytes=weights_bytes,
        reserved_kv_open_to_last_bytes=open_to_last_reserved(result),
        split=split,
        load_mode=load_mode,
        ready_cost_s=ready_costs(events),
        compile_s_by_graph={e.spec: e.seconds for e in events if e.kind is EventKind.COMPILED},
        first_rung_wall_s=max(
            (
                e.at_s
                for e in events
                if e.kind is EventKind.LOADED and _capacity(e.spec) == result.rungs[0]
            ),
            default=result.ready_s,
        ),
    )


def band_figures(result: DecodeResult, bands_ladder: Ladder) -> tuple[BandFigures, ...]:
    """Decode steps and inference time per context band."""
    decode_steps = [s for s in result.steps if not s.prefill]
    bands = []
    for low, high in band_edges(bands_ladder):
        inside = [s for s in decode_steps if low <= s.live_tokens < high]
        bands.append(
            BandFigures(f"{low}-{high}", low, high, len(inside), sum(s.infer_s for s in inside))
        )
    return tuple(bands)


def boundary_figures(result: DecodeResult) -> tuple[BoundaryFigures, ...]:
    """Each boundary: its wait, its migration and whether its graph came in time."""
    events = result.events
    waits = {e.spec: e.seconds for e in events if e.kind is EventKind.WAIT}
    background = {e.spec for e in events if e.kind is EventKind.LOAD_START and not e.foreground}
    loaded_at = {e.spec: e.at_s for e in events if e.kind is EventKind.LOADED}
    boundaries = []
    for b in result.boundaries:
        label = f"decode@{b.migration.to_capacity_tokens}"
        in_background = label in background
        boundaries.append(
            BoundaryFigures(
                from_capacity_tokens=b.migration.from_capacity_tokens,
                to_capacity_tokens=b.migration.to_capacity_tokens,
                at_live_tokens=b.at_live_tokens,
                wait_s=b.program_wait_s,
                deadline_met=in_background and label not in waits,
                loaded_in_background=in_background,
                migration_s=b.migration.seconds,
                copied_bytes=b.migration.copied_bytes,
                allocated_bytes=b.migration.allocated_bytes,
                peak_reserved_bytes=b.migration.peak_reserved_bytes,
                moved_bytes=b.migration.moved_bytes,
                peak_physical_bytes=b.migration.peak_physical_bytes,
                boundary_at_s=b.began_s,
                ready_at_s=loaded_at.get(label, 0.0),
            )
        )
    return tuple(boundaries)


def _capacity(label: str) -> int:
    """``decode@512`` or ``prefill@512x128`` -> 512."""
    return int(label.split("@")[1].split("x")[0])


def ready_costs(events: Sequence[LoaderEvent]) -> dict[str, float]:
    """Per graph: its build (the host's whole build under the split, else compile +
    export as recorded) plus its import and warm-up: what a boundary waits for."""
    out: dict[str, float] = {}
    for e in events:
        if e.kind is EventKind.COMPILED:
            out[e.spec] = e.build_s or e.seconds
    for e in events:
        if e.kind is EventKind.LOADED and e.spec in out:
            out[e.spec] += e.seconds
    return out


def open_to_last_reserved(result: DecodeResult) -> float:
    """Reserved KV bytes averaged over [open, last token], the foreground included
    (0 until the first rung's KV exists, right after the foreground)."""
    if result.finished_s <= 0 or not result.reserved_kv:
        return 0.0
    steps = [s for s in result.steps if not s.prefill]
    first_decode_s = steps[0].began_s if steps else result.finished_s
    area = result.reserved_kv[0][1] * max(0.0, first_decode_s - result.ready_s)
    if steps:
        area += time_weighted_reserved(result) * (result.finished_s - first_decode_s)
    return area / result.finished_s


def time_weighted_reserved(result: DecodeResult) -> float:
    """Reserved KV bytes averaged over the decode's wall time (prefill to last token)."""
    # reserved_kv[0] is after the prefill; entry i is what decode step i ran with.
    steps = [s for s in result.steps if not s.prefill]
    if not steps:
        return float(result.reserved_kv[-1][1]) if result.reserved_kv else 0.0
    starts = [s.began_s for s in steps]
    ends = [*starts[1:], result.finished_s]
    reserved = [r for _, r in result.reserved_kv[1:]]
    total = sum(e - s for s, e in zip(starts, ends, strict=True))
    if total <= 0:
        return float(reserved[-1])
    return sum(r * (e - s) for r, s, e in zip(reserved, starts, ends, strict=True)) / total


def _decode_values(result: DecodeResult, physical: bool) -> list[int] | None:
    """Bytes after each decode step (sample 0 is the prefill's); None if not measured."""
    samples = result.kv_samples[1:]
    if physical:
        values = [s.physical_bytes for s in samples]
        return None if not values or None in values else [int(v or 0) for v in values]
    return [s.reserved_bytes for s in samples] or None


def time_weighted_physical(result: DecodeResult) -> float | None:
    """Committed KV bytes averaged over the decode's wall time, as reserved is."""
    steps = [s for s in result.steps if not s.prefill]
    values = _decode_values(result, physical=True)
    if values is None or len(values) != len(steps):
        return None
    starts = [s.began_s for s in steps]
    ends = [*starts[1:], result.finished_s]
    total = sum(e - s for s, e in zip(starts, ends, strict=True))
    if total <= 0:
        return float(values[-1])
    return sum(v * (e - s) for v, s, e in zip(values, starts, ends, strict=True)) / total


def token_weighted(result: DecodeResult, physical: bool) -> float | None:
    """KV bytes averaged over decoded tokens (each decode step holds one token's worth
    of the run, whatever it cost in time)."""
    values = _decode_values(result, physical)
    return sum(values) / len(values) if values else None


def peak_physical(result: DecodeResult) -> int | None:
    values = [s.physical_bytes for s in result.kv_samples]
    values += [b.migration.peak_physical_bytes for b in result.boundaries]
    known = [v for v in values if v is not None]
    return max(known) if known else None


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values (a band a protocol never decoded in)."""
    return statistics.median(values) if values else float("nan")
