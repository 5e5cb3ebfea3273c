"""A sweep's wall time, estimated from a committed sweep's raw samples before running it:
per cell, each arm's mean critical path (less the decode bands past a lower top rung)
plus the per-run overhead the committed run paid (fresh process, model read, store).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ovspec.bench.protocols.calibration import calibration_protocol
from ovspec.bench.sweep.runner import Cell, SweepGrid


@dataclass(frozen=True)
class CellEstimate:
    label: str
    seconds: float | None  # None: no committed cell to estimate it from
    source: str  # the committed cell it comes from, or why none


def run_overhead_s(document: Mapping[str, Any]) -> float:
    """Seconds per run beyond its critical path: the committed wall less every run's
    critical path (auto's calibration counted as a run of its protocol), over the runs."""
    cells = document["cells"]
    paths = [float(run["critical_path_s"]) for cell in cells for run in cell["runs"]]
    calibrator = document.get("calibration_protocol", "I1")
    calibrations = [
        _mean_path(cell["runs"], calibrator, None) for cell in cells if cell["calibration"]
    ]
    runs = len(paths) + len(calibrations)
    return max(0.0, (float(document["wall_s"]) - sum(paths) - sum(calibrations)) / runs)


def _mean_path(runs: Sequence[Mapping[str, Any]], protocol: str, top_tokens: int | None) -> float:
    """The mean critical path of ``protocol``'s runs, less the decode time of bands
    above ``top_tokens`` (a cell with a lower top rung does not decode them)."""
    paths = []
    for run in runs:
        if run["protocol"] != protocol:
            continue
        cut = 0.0
        if top_tokens is not None:
            cut = sum(b["infer_s"] for b in run["bands"] if b["low_tokens"] >= top_tokens)
        paths.append(run["critical_path_s"] - cut)
    if not paths:
        raise KeyError(protocol)
    return statistics.fmean(paths)


def _source(cells: Sequence[Mapping[str, Any]], cell: Cell) -> Mapping[str, Any] | None:
    """The committed cell of the same preset and compression whose ladder holds every
    rung of ``cell``'s (the same ladder, or a lower top)."""
    preset, _, ladder, compression = cell
    for done in cells:
        if (done["preset"], done["compression"]) == (preset, compression) and set(ladder) <= set(
            done["ladder"]
        ):
            return done
    return None


def estimate(document: Mapping[str, Any], grid: SweepGrid) -> list[CellEstimate]:
    """Each of ``grid``'s cells' seconds: every repetition of every arm, and auto's
    calibration run, from ``document`` (a committed sweep's results)."""
    overhead_s = run_overhead_s(document)
    protocols = [p.value for p in grid.protocols]
    out = []
    for cell in grid.cells():
        preset, name, ladder, compression = cell
        label = f"{preset} / {name} / {compression}"
        done = _source(document["cells"], cell)
        if done is None:
            out.append(CellEstimate(label, None, "no committed cell holds this ladder"))
            continue
        top = ladder.top_tokens if ladder.top_tokens < max(done["ladder"]) else None
        try:
            arms = [_mean_path(done["runs"], p, top) + overhead_s for p in protocols]
            calibrator = calibration_protocol(grid.protocols).value
            calibration = _mean_path(done["runs"], calibrator, top) + overhead_s
        except KeyError as missing:
            out.append(CellEstimate(label, None, f"the committed cell has no {missing} runs"))
            continue
        seconds = grid.repetitions * sum(arms) + (calibration if "auto" in protocols else 0.0)
        where = f"{done['preset']} / {done['ladder_name']} / {done['compression']}"
        out.append(CellEstimate(label, seconds, where + (f" up to {top}" if top else "")))
    return out
