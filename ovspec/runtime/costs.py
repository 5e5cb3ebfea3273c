"""Where a deadline plan's costs come from: the store's compile history, or a measurement.

``history`` reads the recorded build of each rung from the compiler's store (no
lookups, so the store's counters stay as they are); ``measure`` makes each rung
ready through a loader and times a short decode on it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ovspec.errors import BadRequestError, arg
from ovspec.ladder import Ladder
from ovspec.runtime.plan import RungCosts

if TYPE_CHECKING:
    from ovspec.compile.compiler import Compiler
    from ovspec.ir.specialize import Specialization
    from ovspec.runtime.loader import Loader

DEFAULT_MEASURE_STEPS = 32


@dataclass(frozen=True)
class RecordedCompile:
    """A blob's build as the store recorded it."""

    label: str
    key_hex: str
    compile_s: float
    export_s: float

    @property
    def build_s(self) -> float:
        return self.compile_s + self.export_s


def compile_history(
    compiler: Compiler, specs: Sequence[Specialization]
) -> dict[Specialization, RecordedCompile]:
    """The recorded build of each spec whose exact key (this model, device,
    properties, compression, blob mode) is in the compiler's store. Listing the index
    leaves the store's hit/miss counters alone, unlike a lookup."""
    by_hex = {entry.hex: entry for entry in compiler.store.entries()}
    out: dict[Specialization, RecordedCompile] = {}
    for spec in specs:
        key = compiler.key(spec)
        entry = by_hex.get(key.hex)
        if entry is None or entry.components != key.components:
            continue
        try:
            export_s = float(entry.metadata.get("export_s", "0") or 0)
        except ValueError:
            export_s = 0.0
        out[spec] = RecordedCompile(spec.label, entry.hex, entry.compile_s, export_s)
    return out


@dataclass(frozen=True)
class History:
    """The recorded builds a plan's compile costs come from."""

    decode: Mapping[int, RecordedCompile]  # rung -> its decode graph's build
    prefill: RecordedCompile | None  # the first rung's prefill graph, if built

    def compile_s(self) -> dict[int, float]:
        """Build seconds (compile + export) per rung; import is not in the history."""
        return {rung: record.build_s for rung, record in self.decode.items()}


def history(
    compiler: Compiler, ladder: Ladder, rungs: Sequence[int], prefill_chunk_tokens: int
) -> History:
    """The store's history for every rung from ``rungs[0]`` up; a clear error naming
    those of ``rungs`` (the ones a request needs) that have none."""
    from ovspec.ir.specialize import Specialization, prefill_specialization

    first = rungs[0]
    decode_specs = [Specialization.decode(r) for r in ladder if r >= first]
    prefill_spec = prefill_specialization(first, prefill_chunk_tokens)
    found = compile_history(compiler, [*decode_specs, prefill_spec])
    missing = [r for r in rungs if Specialization.decode(r) not in found]
    if missing:
        raise BadRequestError(
            f"no compile history for {', '.join(f'decode@{r}' for r in missing)} in the "
            f"store {compiler.store.root} for this model, device and properties; run "
            f"`ovspec build` with this ladder first, or give {arg('compile_s')} (or "
            f"{arg('measure')})"
        )
    return History(
        decode={s.capacity_tokens: found[s] for s in decode_specs if s in found},
        prefill=found.get(prefill_spec),
    )


@dataclass(frozen=True)
class RungMeasurement:
    """One rung's program made ready through the store, then a short decode on it."""

    capacity_tokens: int
    store_hit: bool
    compile_s: float  # recorded (hit) or just now (miss)
    export_s: float
    import_s: float  # measured now
    decode_s_per_token: float  # median wall time of one decode step
    decode_mean_s_per_token: float  # a window is a sum of steps; the median skips hiccups
    steps: int

    @property
    def ready_s(self) -> float:
        """Build + import: the time a cold successor needs to be ready."""
        return self.compile_s + self.export_s + self.import_s


@dataclass(frozen=True)
class Measurement:
    rungs: tuple[RungMeasurement, ...]
    prefill_label: str
    prefill_compile_s: float  # build + import of the first rung's prefill graph
    prefill_s: float  # running the prompt on the first rung

    def costs(self) -> RungCosts:
        return RungCosts(
            compile_s={m.capacity_tokens: m.ready_s for m in self.rungs},
            decode_s_per_token={m.capacity_tokens: m.decode_s_per_token for m in self.rungs},
            prefill_compile_s=self.prefill_compile_s,
            prefill_s=self.prefill_s,
        )


def _prompt_ids(count: int) -> list[int]:
    # Any valid ids do: a static graph's step time does not depend on their values.
    return [1 + (i * 7) % 97 for i in range(count)]


def measure(
    loader: Loader,
    rungs: Sequence[int],
    prompt_tokens: int,
    steps: int = DEFAULT_MEASURE_STEPS,
    on_progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Make each rung's decode program ready through ``loader`` (a store hit imports,
    a miss compiles into the store), then time ``steps`` teacher-forced decode steps
    on it from an empty KV; the first rung also runs a ``prompt_tokens`` prefill.
    Use an on-demand loader, so nothing compiles behind the measurement."""
    from ovspec.ir.specialize import Specialization, prefill_specialization
    from ovspec.runtime.kv import KVLayout, make_kv
    from ovspec.runtime.session import DecodeSession

    if steps < 1:
        raise BadRequestError(f"{arg('steps', str(steps))} must be at least 1")
    say = on_progress or (lambda _message: None)
    chunk = loader.prefill_chunk_tokens or 1
    first = rungs[0]

    prefill_spec = prefill_specialization(first, chunk)
    say(f"preparing {prefill_spec.label}")
    loader.get(prefill_spec)
    roles = loader.compiler.roles()
    prefill_program = loader.program(prefill_spec)
    assert prefill_program is not None  # get() just loaded it
    prefill_compile_s = (
        prefill_program.build.compile_s + prefill_program.build.export_s + prefill_program.import_s
    )

    measured: list[RungMeasurement] = []
    prefill_s = 0.0
    for rung in rungs:
        spec = Specialization.decode(rung)
        say(f"preparing {spec.label}")
        loader.get(spec)
        program = loader.program(spec)
        assert program is not None
        if rung == first:
            kv = make_kv(KVLayout.COPY_AND_GROW, roles, rung, rung)
            session = DecodeSession(roles, loader.ladder, kv, loader, chunk)
            try:
                began = time.perf_counter()
                session.prefill(_prompt_ids(prompt_tokens))
                prefill_s = time.perf_counter() - began
            finally:
                session.close()
        count = min(steps, rung)
        say(f"decoding {count} steps on {spec.label}")
        kv = make_kv(KVLayout.COPY_AND_GROW, roles, rung, rung)
        session = DecodeSession(roles, loader.ladder, kv, loader, chunk)
        step_s: list[float] = []
        try:
            for token in _prompt_ids(count):
                began = time.perf_counter()
                session.step(token)
                step_s.append(time.perf_counter() - began)
        finally:
            session.close()
        measured.append(
            RungMeasurement(
                capacity_tokens=rung,
                store_hit=program.build.hit,
                compile_s=program.build.compile_s,
                export_s=program.build.export_s,
                import_s=program.import_s,
                decode_s_per_token=statistics.median(step_s),
                decode_mean_s_per_token=statistics.fmean(step_s),
                steps=count,
            )
        )
    return Measurement(tuple(measured), prefill_spec.label, prefill_compile_s, prefill_s)
