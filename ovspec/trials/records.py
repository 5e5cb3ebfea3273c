"""A compile trial's persisted data: its plan, its runs, and the file that holds them.

Owns the trial plan and its identity, the run record, the results file (a header
line, then one JSON line per run, appended as runs land) and the environment guard
that refuses, rather than averages, runs whose recorded environment differs from their
arm's other runs.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ovspec.compile.worker import (
    WORKER_FORMAT_VERSION,
)
from ovspec.errors import BadRequestError, TrialError, arg
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.specialize import Phase, Specialization
from ovspec.ladder import Ladder
from ovspec.stats.orders import Arm, ab_orders
from ovspec.store.digests import DigestMemo
from ovspec.trials.arms import ArmSpec
from ovspec.version import __version__

# Bump when a header or run field changes meaning.
# History: 1 — first format (2026-11).
TRIAL_FORMAT_VERSION = 1

# Pair 0 is run and recorded but never summarized: it takes the first-run costs
# (page cache of the model files, a cold interpreter) that later pairs do not pay.
WARMUP_PAIRS = 1

DEFAULT_RUN_TIMEOUT_S = 3600.0

# Environment fields that must also agree *between* the arms: a trial compares two
# compilers on one machine, never two machines.
SHARED_ENVIRONMENT_FIELDS = ("host", "cpu_model", "kernel", "device")


def specializations_for(
    rungs: Ladder, phase: Phase, chunk_tokens: int
) -> tuple[Specialization, ...]:
    """One specialization per rung; a prefill chunk shrinks to fit a small rung."""
    if phase is Phase.DECODE:
        return tuple(Specialization.decode(c) for c in rungs)
    return tuple(Specialization.prefill(c, min(chunk_tokens, c)) for c in rungs)


def model_digest(model: ModelDir, memo: DigestMemo | None = None) -> str:
    """xxh3-128 over the IR's structure and weights digests: which model was compiled."""
    memo = memo or DigestMemo()
    text = f"xml={memo.digest(model.xml_path)}\nbin={memo.digest(model.bin_path)}\n"
    return xxhash.xxh3_128_hexdigest(text.encode())


@dataclass(frozen=True)
class PlannedRun:
    """One compile of the plan: pair ``pair`` (0 is the warm-up), ``position`` 0 or 1."""

    pair: int
    spec: Specialization
    arm: Arm
    position: int

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.pair, self.spec.label, self.arm.value)

    @property
    def warmup(self) -> bool:
        return self.pair < WARMUP_PAIRS


@dataclass(frozen=True)
class TrialPlan:
    """What a trial compiles, under which arms, how many pairs, in which orders.

    ``pairs`` counts measured pairs; ``WARMUP_PAIRS`` more are run first. The orders
    are AB/BA alternating from a start drawn from ``seed``: a longer trial's orders
    extend a shorter one's, so ``pairs`` can grow when a trial is resumed.
    """

    model: ModelDir
    model_digest: str
    specializations: tuple[Specialization, ...]
    device: str
    arm_a: ArmSpec
    arm_b: ArmSpec
    pairs: int
    seed: int
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S

    def __post_init__(self) -> None:
        if isinstance(self.pairs, bool) or not isinstance(self.pairs, int) or self.pairs < 2:
            raise BadRequestError(
                f"{arg('pairs', str(self.pairs))} is too few: a paired CI needs at least 2 "
                "measured pairs"
            )
        if not self.specializations:
            raise BadRequestError(f"a trial needs at least one rung; give {arg('rungs')}")
        labels = [s.label for s in self.specializations]
        if len(set(labels)) != len(labels):
            raise BadRequestError(f"rungs repeat: {', '.join(labels)}")
        if self.arm_a.arm is not Arm.A or self.arm_b.arm is not Arm.B:
            raise BadRequestError("arm_a must be arm A and arm_b arm B")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise BadRequestError(f"run timeout {self.timeout_s!r} s must be positive")
        if not self.device.strip():
            raise BadRequestError(f"the device is empty; give e.g. {arg('device', 'CPU')}")

    @classmethod
    def for_rungs(
        cls,
        model: ModelDir,
        rungs: Ladder,
        phase: Phase,
        chunk_tokens: int,
        device: str,
        arms: tuple[ArmSpec, ArmSpec],
        pairs: int,
        seed: int,
        timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    ) -> TrialPlan:
        """The trial of one specialization per rung of ``rungs`` (which must fit the
        model), the model named by its digest."""
        rungs.check_fits(model.max_position_embeddings)
        return cls(
            model=model,
            model_digest=model_digest(model, DigestMemo()),
            specializations=specializations_for(rungs, phase, chunk_tokens),
            device=device,
            arm_a=arms[0],
            arm_b=arms[1],
            pairs=pairs,
            seed=seed,
            timeout_s=timeout_s,
        )

    def arm(self, arm: Arm) -> ArmSpec:
        return self.arm_a if arm is Arm.A else self.arm_b

    def orders(self) -> list[tuple[Arm, Arm]]:
        """The order of each pair, warm-up first."""
        return ab_orders(self.pairs + WARMUP_PAIRS, self.seed)

    def schedule(self) -> list[PlannedRun]:
        """Every run in execution order: pair by pair, rung by rung, first arm first."""
        runs: list[PlannedRun] = []
        for pair, order in enumerate(self.orders()):
            for spec in self.specializations:
                runs.extend(PlannedRun(pair, spec, arm, pos) for pos, arm in enumerate(order))
        return runs

    def identity(self) -> dict[str, Any]:
        """What makes two invocations the same trial; a results file records it."""
        return {
            "format": TRIAL_FORMAT_VERSION,
            "worker_format": WORKER_FORMAT_VERSION,
            "model_digest": self.model_digest,
            "device": self.device,
            "specializations": [s.label for s in self.specializations],
            "arms": {"A": self.arm_a.to_dict(), "B": self.arm_b.to_dict()},
            "seed": self.seed,
            "warmup_pairs": WARMUP_PAIRS,
        }

    def digest(self) -> str:
        """A short name for this trial (default results file names use it)."""
        text = json.dumps(self.identity(), sort_keys=True)
        return xxhash.xxh3_64_hexdigest(text.encode())[:12]

    def header(self) -> dict[str, Any]:
        return {
            "kind": "header",
            **self.identity(),
            "model": str(self.model.xml_path),
            "pairs_planned": self.pairs,
            "ovspec": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def _finite_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TrialError(f"run field {name} is {value!r}, not a number")
    if not (math.isfinite(value) and value >= 0):
        raise TrialError(f"run field {name} is {value!r}, not a finite duration")
    return float(value)


@dataclass(frozen=True)
class RunRecord:
    """One compile as measured by a worker, placed in the plan."""

    pair: int
    spec_label: str
    arm: Arm
    position: int
    wall_s: float
    cpu_s: float
    prepare_s: float
    export_s: float
    blob_xxh3: str
    blob_bytes: int
    peak_rss_bytes: int
    environment: Mapping[str, Any] = field(compare=False)
    properties_applied: Mapping[str, str] = field(compare=False)

    def __post_init__(self) -> None:
        if self.pair < 0 or self.position not in (0, 1):
            raise TrialError(f"run at pair {self.pair} position {self.position} is out of plan")
        for name in ("wall_s", "cpu_s", "prepare_s", "export_s"):
            _finite_seconds(name, getattr(self, name))
        if self.wall_s <= 0.0:
            raise TrialError(f"run {self.key} has a compile wall time of {self.wall_s!r} s")
        if not self.blob_xxh3 or self.blob_bytes <= 0:
            raise TrialError(f"run {self.key} recorded no exported blob")
        if not isinstance(self.environment, Mapping) or "libraries" not in self.environment:
            raise TrialError(f"run {self.key} recorded no environment")

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.pair, self.spec_label, self.arm.value)

    @property
    def warmup(self) -> bool:
        return self.pair < WARMUP_PAIRS

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "run",
            "pair": self.pair,
            "warmup": self.warmup,
            "specialization": self.spec_label,
            "arm": self.arm.value,
            "position": self.position,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "prepare_s": self.prepare_s,
            "export_s": self.export_s,
            "blob_xxh3": self.blob_xxh3,
            "blob_bytes": self.blob_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "properties_applied": dict(self.properties_applied),
            "environment": dict(self.environment),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        try:
            return cls(
                pair=int(data["pair"]),
                spec_label=str(data["specialization"]),
                arm=Arm(data["arm"]),
                position=int(data["position"]),
                wall_s=_finite_seconds("wall_s", data["wall_s"]),
                cpu_s=_finite_seconds("cpu_s", data["cpu_s"]),
                prepare_s=_finite_seconds("prepare_s", data["prepare_s"]),
                export_s=_finite_seconds("export_s", data["export_s"]),
                blob_xxh3=str(data["blob_xxh3"]),
                blob_bytes=int(data["blob_bytes"]),
                peak_rss_bytes=int(data["peak_rss_bytes"]),
                environment=dict(data["environment"]),
                properties_applied=dict(data.get("properties_applied", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TrialError(f"malformed run record ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def from_worker(cls, planned: PlannedRun, result: Mapping[str, Any]) -> RunRecord:
        return cls.from_json(
            {
                **result,
                "pair": planned.pair,
                "specialization": planned.spec.label,
                "arm": planned.arm.value,
                "position": planned.position,
            }
        )


def _first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first field where two environments differ, as a human phrase."""
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name), b.get(name)
        if va == vb:
            continue
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            for key in sorted(set(va) | set(vb)):
                if va.get(key) != vb.get(key):
                    return f"{name}[{key}]: {va.get(key)!r} vs {vb.get(key)!r}"
        return f"{name}: {va!r} vs {vb!r}"
    return None


class EnvironmentGuard:
    """Admits runs whose environment matches their arm's first run (and shares the
    host with the other arm's); anything else is a ``TrialError``, never averaged."""

    def __init__(self) -> None:
        self._reference: dict[Arm, RunRecord] = {}

    def admit(self, record: RunRecord) -> None:
        reference = self._reference.get(record.arm)
        if reference is None:
            other = self._reference.get(record.arm.other)
            if other is not None:
                self._check_shared(record, other)
            self._reference[record.arm] = record
            return
        diff = _first_difference(reference.environment, record.environment)
        if diff is not None:
            raise TrialError(
                f"arm {record.arm.value} run (pair {record.pair}, {record.spec_label}) ran in a "
                f"different environment than its run at pair {reference.pair}, "
                f"{reference.spec_label}: {diff}; runs from different environments are not "
                f"averaged: restore the environment or start a new trial with another {arg('out')}"
            )

    def _check_shared(self, record: RunRecord, other: RunRecord) -> None:
        for name in SHARED_ENVIRONMENT_FIELDS:
            mine, theirs = record.environment.get(name), other.environment.get(name)
            if mine != theirs:
                raise TrialError(
                    f"arm {record.arm.value} ran with {name} {mine!r} but arm "
                    f"{other.arm.value} with {theirs!r}: an A/B trial compares two compilers "
                    "on one machine"
                )

    def environment(self, arm: Arm) -> Mapping[str, Any] | None:
        ref = self._reference.get(arm)
        return ref.environment if ref is not None else None


class ResultsFile:
    """A header line, then one JSON line per run, appended and fsynced as runs land.

    The header is written with the first run, so a trial that fails before any run
    leaves no file behind to conflict with the corrected command.
    """

    def __init__(self, path: Path, header: Mapping[str, Any], identity: Mapping[str, Any]):
        self.path = path
        self._header = dict(header)
        self._identity = json.loads(json.dumps(dict(identity)))
        self._has_header = False

    def load(self) -> list[RunRecord]:
        """The runs already recorded; refuses a file made by a different trial."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise TrialError(f"cannot read results file {self.path}: {exc.strerror}") from exc
        lines = raw.split(b"\n")
        if raw and not raw.endswith(b"\n"):
            # A run killed mid-write leaves a torn last line: drop it, it is re-run.
            self._truncate(len(raw) - len(lines[-1]))
        lines = [line for line in lines[:-1] if line.strip()]
        if not lines:
            return []
        header = self._parse(lines[0], 1)
        if header.get("kind") != "header":
            raise TrialError(f"results file {self.path} does not start with a trial header")
        self._check_identity(header)
        self._has_header = True
        records = []
        for number, line in enumerate(lines[1:], start=2):
            data = self._parse(line, number)
            if data.get("kind") != "run":
                raise TrialError(f"results file {self.path} line {number} is not a run record")
            records.append(RunRecord.from_json(data))
        seen: set[tuple[int, str, str]] = set()
        for record in records:
            if record.key in seen:
                raise TrialError(f"results file {self.path} records run {record.key} twice")
            seen.add(record.key)
        return records

    def _parse(self, line: bytes, number: int) -> dict[str, Any]:
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise TrialError(
                f"results file {self.path} line {number} is not JSON ({exc}); it is damaged"
            ) from exc
        if not isinstance(data, dict):
            raise TrialError(f"results file {self.path} line {number} is not a JSON object")
        return data

    def _check_identity(self, header: Mapping[str, Any]) -> None:
        recorded = {k: header.get(k) for k in self._identity}
        if recorded == self._identity:
            return
        diff = _first_difference(recorded, self._identity) or "?"
        raise TrialError(
            f"results file {self.path} was made by a different trial ({diff}); use another "
            f"{arg('out')}, or the same arguments to continue it"
        )

    def _truncate(self, size: int) -> None:
        with self.path.open("r+b") as f:
            f.truncate(size)

    def append(self, record: RunRecord) -> None:
        lines = []
        if not self._has_header:
            lines.append(json.dumps(self._header, sort_keys=True))
        lines.append(json.dumps(record.to_json(), sort_keys=True))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        self._has_header = True
