"""The build workflow: prewarm the store with a ladder x phases on one device.

Validates everything it can before touching the store (model, ladder, device), then
builds each specialization through a ``Compiler``, ``jobs`` at a time, reporting each
outcome as it lands so the CLI can show progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import openvino as ov

from ovspec.compile.compiler import NO_PATCH, Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.modes import BlobMode
from ovspec.compile.preparing import prepare_model
from ovspec.compile.programs import BuildOutcome
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.specialize import DynamicLLM, Phase, Specialization, prefill_specialization
from ovspec.ladder import Ladder
from ovspec.store.digests import DigestMemo
from ovspec.store.local import Store


@dataclass(frozen=True)
class BuildPlan:
    """What to build: validated before the store is opened."""

    model: ModelDir
    ladder: Ladder
    phases: tuple[Phase, ...]
    chunk_tokens: int
    device: str
    properties: Mapping[str, str]
    compression: Compression
    jobs: int = 1
    patch_id: str = NO_PATCH
    blob_mode: BlobMode = BlobMode.WEIGHTLESS

    def __post_init__(self) -> None:
        if not self.phases:
            raise BadRequestError(f"no phases to build; give {arg('phases', 'decode,prefill')}")
        if self.jobs < 1:
            raise BadRequestError(f"{arg('jobs', str(self.jobs))} must be at least 1")
        if self.chunk_tokens < 1:
            raise BadRequestError(
                f"{arg('chunk_tokens', str(self.chunk_tokens))} must be at least 1"
            )
        self.ladder.check_fits(self.model.max_position_embeddings)

    def specializations(self) -> list[Specialization]:
        specs: list[Specialization] = []
        for capacity in self.ladder:
            for phase in self.phases:
                if phase is Phase.DECODE:
                    specs.append(Specialization.decode(capacity))
                else:
                    specs.append(prefill_specialization(capacity, self.chunk_tokens))
        return specs


@dataclass(frozen=True)
class BuildReport:
    outcomes: tuple[BuildOutcome, ...]
    wall_s: float

    @property
    def hits(self) -> int:
        return sum(o.hit for o in self.outcomes)

    @property
    def fetched(self) -> int:
        """Local misses the remote tier served (nothing compiled for them)."""
        return sum(o.fetched for o in self.outcomes)

    @property
    def misses(self) -> int:
        """Specializations compiled by this run."""
        return len(self.outcomes) - self.hits - self.fetched

    @property
    def compile_s(self) -> float:
        """Compile seconds spent by this run (compiled specializations only)."""
        return sum(o.compile_s for o in self.outcomes if not o.hit and not o.fetched)

    @property
    def saved_s(self) -> float:
        """Compile seconds the hits and fetches saved."""
        return sum(o.compile_s for o in self.outcomes if o.hit or o.fetched)

    @property
    def fetched_bytes(self) -> int:
        return sum(o.blob_bytes for o in self.outcomes if o.fetched)

    @property
    def blob_bytes(self) -> int:
        return sum(o.blob_bytes for o in self.outcomes)


def parse_phases(text: str) -> tuple[Phase, ...]:
    phases: list[Phase] = []
    for part in (p.strip().lower() for p in text.split(",")):
        try:
            phase = Phase(part)
        except ValueError:
            raise BadRequestError(
                f"unknown phase {part!r} in {arg('phases')}; choose decode, prefill or both"
            ) from None
        if phase not in phases:
            phases.append(phase)
    return tuple(phases)


def check_device(plan: BuildPlan) -> None:
    """Fail on an unusable device before the store is opened or written."""
    profile_for(plan.device, plan.properties).resolve(ov.Core(), plan.properties)


def check_model(plan: BuildPlan) -> DynamicLLM:
    """Read and prepare the model before the store is opened (a bad IR fails here)."""
    return prepare_model(plan.model, plan.compression)


def plan_compiler(
    plan: BuildPlan, store: Store, memo: DigestMemo | None = None, llm: DynamicLLM | None = None
) -> Compiler:
    return Compiler(
        plan.model,
        plan.device,
        plan.properties,
        store,
        compression=plan.compression,
        patch_id=plan.patch_id,
        memo=memo,
        blob_mode=plan.blob_mode,
        llm=llm,
    )


def all_stored(plan: BuildPlan, store: Store) -> bool:
    """Whether every specialization of ``plan`` looks stored already, locally or on the
    store's remote tier: then a build compiles nothing and never needs the prepared (or
    compressed) model. Counts nothing and writes nothing: the model's files are hashed
    in memory (reading the on-disk digest memo would update it, and bad input must
    leave the store as it was)."""
    compiler = plan_compiler(plan, store, memo=DigestMemo(None))
    tier = store.tier
    try:
        return all(
            store.peek(key) or (tier is not None and tier.contains(key))
            for key in (compiler.key(spec) for spec in plan.specializations())
        )
    finally:
        compiler.close()


def run_build(
    plan: BuildPlan,
    store: Store,
    on_outcome: Callable[[BuildOutcome], None] | None = None,
    llm: DynamicLLM | None = None,
) -> BuildReport:
    """Build every specialization of ``plan`` into ``store``."""
    compiler = plan_compiler(plan, store, llm=llm)
    specs = plan.specializations()
    began = time.perf_counter()
    try:
        outcomes = _build_all(compiler, specs, plan.jobs, on_outcome)
    finally:
        compiler.close()
    order = {spec: i for i, spec in enumerate(specs)}
    outcomes.sort(key=lambda o: order[o.spec])
    return BuildReport(tuple(outcomes), time.perf_counter() - began)


def _build_all(
    compiler: Compiler,
    specs: Sequence[Specialization],
    jobs: int,
    on_outcome: Callable[[BuildOutcome], None] | None,
) -> list[BuildOutcome]:
    outcomes: list[BuildOutcome] = []
    if jobs == 1:
        for spec in specs:
            outcome = compiler.build(spec)
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
        return outcomes
    # OpenVINO releases the GIL while compiling, so threads compile in parallel.
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ovspec-build") as pool:
        futures = [pool.submit(compiler.build, spec) for spec in specs]
        for future in as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
    return outcomes
