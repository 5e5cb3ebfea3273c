"""Moving a whole ladder between the local store and its remote tier, on request.

``push`` uploads the blobs of a build plan the local store holds (each checked against
its local checksum on the way out); ``pull`` fetches those the local store lacks, each
verified against its manifest and imported once on this device before it is stored
(``ovspec cache push|pull``). Neither compiles: a blob missing at the source is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ovspec.compile.prewarm import BuildPlan, plan_compiler
from ovspec.errors import BadRequestError, arg
from ovspec.ir.specialize import Specialization
from ovspec.store.local import Store
from ovspec.store.tier import Tier, Transfer, TransferStatus


@dataclass(frozen=True)
class SpecTransfer:
    spec: Specialization
    transfer: Transfer

    def to_json(self) -> dict[str, object]:
        return {"specialization": self.spec.label, **self.transfer.to_json()}


@dataclass(frozen=True)
class SharingReport:
    direction: str  # "push" or "pull"
    remote: str
    transfers: tuple[SpecTransfer, ...]
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(t.transfer.status.ok for t in self.transfers)

    @property
    def moved_bytes(self) -> int:
        return sum(t.transfer.moved_bytes for t in self.transfers)

    def count(self, status: TransferStatus) -> int:
        return sum(t.transfer.status is status for t in self.transfers)

    def to_json(self) -> dict[str, object]:
        return {
            "direction": self.direction,
            "remote": self.remote,
            "ok": self.ok,
            "moved_bytes": self.moved_bytes,
            "wall_s": self.wall_s,
            "counts": {s.value: self.count(s) for s in TransferStatus if self.count(s)},
            "specializations": [t.to_json() for t in self.transfers],
        }


def _tier(store: Store) -> Tier:
    if store.tier is None:
        raise BadRequestError(
            f"no remote to share with; give {arg('remote', 's3://BUCKET/PREFIX')} "
            "(or set OVSPEC_REMOTE)"
        )
    return store.tier


def push(
    plan: BuildPlan, store: Store, on_transfer: Callable[[SpecTransfer], None] | None = None
) -> SharingReport:
    """Upload every blob of ``plan`` that the local store holds."""
    tier = _tier(store)
    compiler = plan_compiler(plan, store)
    began = time.perf_counter()
    done: list[SpecTransfer] = []
    try:
        for spec in plan.specializations():
            moved = SpecTransfer(spec, tier.push(compiler.key(spec)))
            done.append(moved)
            if on_transfer is not None:
                on_transfer(moved)
    finally:
        compiler.close()
    return SharingReport("push", tier.location, tuple(done), time.perf_counter() - began)


def pull(
    plan: BuildPlan, store: Store, on_transfer: Callable[[SpecTransfer], None] | None = None
) -> SharingReport:
    """Fetch every blob of ``plan`` the local store lacks, each proven importable here."""
    tier = _tier(store)
    compiler = plan_compiler(plan, store)

    def usable(spec: Specialization) -> Callable[[Path], None] | None:
        if compiler.facts.offline:
            return None
        # Raises CompileError (the import is then dropped): a blob that does not import,
        # or is another specialization's graph (a forged manifest), is not committed.
        return lambda path: compiler.check_blob(path, spec)

    began = time.perf_counter()
    done: list[SpecTransfer] = []
    try:
        for spec in plan.specializations():
            moved = SpecTransfer(spec, tier.pull(compiler.key(spec), usable(spec)))
            done.append(moved)
            if on_transfer is not None:
                on_transfer(moved)
    finally:
        compiler.close()
    return SharingReport("pull", tier.location, tuple(done), time.perf_counter() - began)
