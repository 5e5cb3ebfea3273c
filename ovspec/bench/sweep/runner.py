"""The generality sweep: the fixed policies and auto across model sizes, ladders and
precisions.

Owns the grid (``SweepGrid``: presets x ladders x compressions, plus extra cells),
running each cell as a small bench (B0, I1, I2 and auto by default, N repetitions in
Williams order, a cold store per run, the same split; auto plans from an untimed
calibration run, I2's) and the results document (every run's figures, auto's plans)
``sweep.page`` renders.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.bench.protocols.calibration import calibration_protocol
from ovspec.bench.protocols.runner import BenchConfig, run_bench
from ovspec.bench.protocols.setups import Protocol
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder

MIB = 2**20
SWEEP_PROTOCOLS = (Protocol.B0, Protocol.I1, Protocol.I2, Protocol.AUTO)
Cell = tuple[str, str, Ladder, str]  # preset, ladder name, ladder, compression


@dataclass(frozen=True)
class SweepGrid:
    presets: tuple[str, ...]
    ladders: tuple[tuple[str, Ladder], ...]  # (name, ladder), e.g. ("doubling", ...)
    compressions: tuple[str, ...]  # none, int8, int4
    prompt_tokens: int
    repetitions: int
    extra_cells: tuple[Cell, ...] = ()  # beyond the product, e.g. a real model on one ladder
    protocols: tuple[Protocol, ...] = SWEEP_PROTOCOLS
    # The half fraction: of the product, the cells whose preset, ladder and compression
    # indices sum to an even number (2 x 2 x 2: 4 cells, every pair of factors' levels once).
    half_fraction: bool = False

    def __post_init__(self) -> None:
        if not (self.presets and self.ladders and self.compressions):
            raise BadRequestError("a sweep needs at least one preset, ladder and compression")
        if self.repetitions < 2:
            raise BadRequestError("a sweep needs --repetitions 2 or more (paired intervals)")
        for ladder in [lad for _, lad in self.ladders] + [c[2] for c in self.extra_cells]:
            if self.prompt_tokens >= ladder.top_tokens:
                raise BadRequestError(
                    f"the {self.prompt_tokens}-token prompt does not fit ladder {ladder}"
                )

    def cells(self) -> list[Cell]:
        indices = itertools.product(
            range(len(self.presets)), range(len(self.ladders)), range(len(self.compressions))
        )
        return [
            (self.presets[p], *self.ladders[lad], self.compressions[c])
            for p, lad, c in indices
            if not self.half_fraction or (p + lad + c) % 2 == 0
        ] + list(self.extra_cells)


def run_sweep(
    grid: SweepGrid,
    resolve: Callable[[str], Any],
    work_dir: Path,
    split: CoreSplit | None,
    properties: Mapping[str, str],
    seed: int = 0,
    on_cell: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Every cell as an I1/I2 bench; returns the results document (JSON-ready).

    ``resolve`` turns a preset name into a ``ModelDir``."""
    began = time.perf_counter()
    cells: list[dict[str, Any]] = []
    grid_cells = grid.cells()
    load_before = os.getloadavg()
    for index, (preset, ladder_name, ladder, compression) in enumerate(grid_cells):
        label = f"{preset} / {ladder_name} / {compression}"
        if on_cell is not None:
            on_cell(index, len(grid_cells), label)
        config = BenchConfig(
            model=resolve(preset),
            ladder=ladder,
            prompt_tokens=grid.prompt_tokens,
            new_tokens=ladder.top_tokens - grid.prompt_tokens,
            repetitions=grid.repetitions,
            variants=("cold",),
            device="CPU",
            properties=dict(properties),
            prefill_chunk_tokens=grid.prompt_tokens,
            seed=seed,
            work_dir=work_dir / f"cell-{index}",
            protocols=grid.protocols,
            split=split,
            load_mode="import",
            compression=compression,
            measure_floor=False,
        )
        result = run_bench(config)
        cells.append(
            {
                "preset": preset,
                "ladder_name": ladder_name,
                "ladder": list(ladder),
                "compression": compression,
                "runs": [r.figures.to_json() for r in result.runs],
                # auto's plan per repetition (its predicted boundaries), and its costs
                "auto_plans": {
                    str(r.figures.repetition): r.timeline.get("auto")
                    for r in result.runs
                    if r.figures.protocol == Protocol.AUTO.value
                },
                "calibration": result.calibrations.get("cold-split" if split else "cold"),
            }
        )
    return {
        "prompt_tokens": grid.prompt_tokens,
        "repetitions": grid.repetitions,
        "protocols": [p.value for p in grid.protocols],
        "calibration_protocol": calibration_protocol(grid.protocols).value,
        "split": split.to_json() if split is not None else None,
        "properties": dict(properties),
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "wall_s": time.perf_counter() - began,
        "cells": cells,
    }


def parse_protocols(text: str) -> tuple[Protocol, ...]:
    """``B0,I1,I2,auto``: the arms of every cell; I1 (the control) is added if missing."""
    known = {p.value.upper(): p for p in Protocol}
    names = [n.strip().upper() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BadRequestError(f"--protocols takes a list of {', '.join(known)} (got {text!r})")
    chosen = [known[n] for n in dict.fromkeys(names)]
    return tuple(chosen if Protocol.I1 in chosen else [Protocol.I1, *chosen])


def parse_cells(texts: Sequence[str]) -> tuple[Cell, ...]:
    """``PRESET:NAME=RUNGS:COMPRESSION`` items, e.g. ``qwen2.5-0.5b:short=256,512:none``."""
    out = []
    for text in texts:
        parts = text.split(":")
        if len(parts) != 3 or not parts[0]:
            raise BadRequestError(f"--cell takes PRESET:NAME=RUNGS:COMPRESSION (got {text!r})")
        ((name, ladder),) = parse_ladders([parts[1]])
        out.append((parts[0], name, ladder, parts[2] or "none"))
    return tuple(out)


def parse_ladders(texts: Sequence[str]) -> tuple[tuple[str, Ladder], ...]:
    """``NAME=LADDER`` items, e.g. ``doubling=128,256,512``."""
    out = []
    for text in texts:
        name, sep, ladder = text.partition("=")
        if not sep or not name:
            raise BadRequestError(f"--ladder takes NAME=RUNGS (got {text!r})")
        out.append((name, Ladder.parse(ladder)))
    return tuple(out)
