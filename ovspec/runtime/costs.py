"""Where a deadline plan's costs come from: the store's compile history, or a measurement.

``history`` reads the recorded build of each rung from the compiler's store (no
lookups, so the store's counters stay as they are), or from its remote tier's
manifests, with the decode step and import times past runs recorded beside the store
(``store.steptimes``), and models a fetch (bytes / the fetch bandwidth the store
measured) for each rung the remote holds; ``measure`` makes each rung ready through a
loader (a fetch where the remote has it) and times a short decode on it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ovspec.errors import BadRequestError, arg
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import AutoCosts
from ovspec.runtime.plan import RungCosts
from ovspec.store.steptimes import StepTimes, read_step_times

if TYPE_CHECKING:
    from ovspec.compile.compiler import Compiler
    from ovspec.ir.specialize import Specialization
    from ovspec.runtime.loader import Loader

DEFAULT_MEASURE_STEPS = 32


@dataclass(frozen=True)
class RecordedCompile:
    """A blob's build as the store (or its remote tier's manifest) recorded it."""

    label: str
    key_hex: str
    compile_s: float
    export_s: float
    blob_bytes: int = 0
    on_remote: bool = False  # the store's remote tier holds it: it can be fetched

    @property
    def build_s(self) -> float:
        return self.compile_s + self.export_s


def compile_history(
    compiler: Compiler, specs: Sequence[Specialization]
) -> dict[Specialization, RecordedCompile]:
    """The recorded build of each spec whose exact key (this model, device,
    properties, compression, blob mode) is in the compiler's store, else in its remote
    tier's manifests. Listing the index leaves the store's hit/miss counters alone,
    unlike a lookup."""
    by_hex = {entry.hex: entry for entry in compiler.store.entries()}
    tier = compiler.store.tier
    out: dict[Specialization, RecordedCompile] = {}
    for spec in specs:
        key = compiler.key(spec)
        entry = by_hex.get(key.hex)
        if entry is not None and entry.components == key.components:
            on_remote = tier is not None and tier.contains(key)
            out[spec] = RecordedCompile(
                spec.label,
                entry.hex,
                entry.compile_s,
                _export_s(entry.metadata),
                entry.size_bytes,
                on_remote,
            )
            continue
        remote = tier.record(key) if tier is not None else None
        if remote is not None:
            out[spec] = RecordedCompile(
                spec.label,
                key.hex,
                remote.compile_s,
                _export_s(remote.metadata),
                remote.size_bytes,
                True,
            )
    return out


def _export_s(metadata: Mapping[str, str]) -> float:
    try:
        return float(metadata.get("export_s", "0") or 0)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class History:
    """The recorded builds a plan's compile costs come from."""

    decode: Mapping[int, RecordedCompile]  # rung -> its decode graph's build
    prefill: RecordedCompile | None  # the first rung's prefill graph, if built
    # Bytes per second of the store's past fetches from its remote (None: none yet).
    fetch_bytes_per_s: float | None = None
    steps: Mapping[int, StepTimes] = field(default_factory=dict)  # rung -> its past runs

    def decode_s_per_token(self) -> dict[int, float]:
        """The recorded decode seconds per token of each rung past runs decoded on."""
        return {rung: times.decode_s_per_token for rung, times in self.steps.items()}

    def auto_costs(self, prompt_rung: int) -> AutoCosts:
        """What ``auto`` plans from: each rung's build + recorded import (a fetch +
        import where the remote holds it and a rate is known) and recorded step time;
        the prompt rung's prefill graph when built (its prompt run is not recorded: the
        same for every schedule that starts there)."""
        fetch = self.fetch_s()
        built = self.ready_s()
        ready = {
            r: fetch[r] + (self.steps[r].import_s if r in self.steps else 0.0)
            if r in fetch
            else built[r]
            for r in self.decode
        }
        prefill = self.prefill_ready_s()
        return AutoCosts(
            ready_s=ready,
            decode_s_per_token=self.decode_s_per_token(),
            prefill_ready_s={prompt_rung: prefill} if prefill is not None else {},
        )

    def ready_s(self) -> dict[int, float]:
        """Seconds until each rung's program is usable when built now: its recorded
        build plus the import past runs recorded for it (0 where none ran it yet)."""
        return {
            rung: record.build_s + (self.steps[rung].import_s if rung in self.steps else 0.0)
            for rung, record in self.decode.items()
        }

    def fetch_s(self) -> dict[int, float]:
        """Fetch seconds (bytes / measured bandwidth) of each rung the remote holds;
        empty until the store has measured a fetch."""
        rate = self.fetch_bytes_per_s
        if not rate:
            return {}
        return {r: rec.blob_bytes / rate for r, rec in self.decode.items() if rec.on_remote}

    def prefill_ready_s(self) -> float | None:
        """The prefill graph's fetch when the remote holds it (and a rate is known),
        else its recorded build; None if neither is known."""
        if self.prefill is None:
            return None
        if self.prefill.on_remote and self.fetch_bytes_per_s:
            return self.prefill.blob_bytes / self.fetch_bytes_per_s
        return self.prefill.build_s


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
    tier = compiler.store.tier
    recorded = read_step_times(compiler.store.root)
    steps = {
        s.capacity_tokens: recorded[compiler.key(s).hex]
        for s in decode_specs
        if compiler.key(s).hex in recorded
    }
    return History(
        decode={s.capacity_tokens: found[s] for s in decode_specs if s in found},
        prefill=found.get(prefill_spec),
        fetch_bytes_per_s=(
            compiler.store.stats().remote.fetch_bytes_per_s if tier is not None else None
        ),
        steps=steps,
    )


@dataclass(frozen=True)
class RungMeasurement:
    """One rung's program made ready through the store, then a short decode on it."""

    capacity_tokens: int
    store_hit: bool
    compile_s: float  # recorded (hit, fetch) or just now (miss)
    export_s: float
    import_s: float  # measured now
    decode_s_per_token: float  # median wall time of one decode step
    decode_mean_s_per_token: float  # a window is a sum of steps; the median skips hiccups
    steps: int
    fetched: bool = False  # came from the remote tier just now
    fetch_s: float = 0.0

    @property
    def build_ready_s(self) -> float:
        """Build + import: the time a cold successor needs to be ready by compiling."""
        return self.compile_s + self.export_s + self.import_s

    @property
    def ready_s(self) -> float:
        """What it took to be ready here: fetch + import when fetched, else build + import."""
        return self.fetch_s + self.import_s if self.fetched else self.build_ready_s


@dataclass(frozen=True)
class Measurement:
    rungs: tuple[RungMeasurement, ...]
    prefill_label: str
    prefill_compile_s: float  # build + import of the first rung's prefill graph
    prefill_s: float  # running the prompt on the first rung

    def costs(self) -> RungCosts:
        return RungCosts(
            compile_s={m.capacity_tokens: m.build_ready_s for m in self.rungs},
            decode_s_per_token={m.capacity_tokens: m.decode_s_per_token for m in self.rungs},
            prefill_compile_s=self.prefill_compile_s,
            prefill_s=self.prefill_s,
            fetch_s={m.capacity_tokens: m.ready_s for m in self.rungs if m.fetched},
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
    loader.share_prompt_rung(first)  # as a decode's start does
    say(f"preparing {prefill_spec.label}")
    loader.get(prefill_spec)
    roles = loader.roles()
    prefill_program = loader.program(prefill_spec)
    assert prefill_program is not None  # get() just loaded it
    built = prefill_program.build
    prefill_compile_s = prefill_program.import_s + (
        built.fetch_s if built.fetched else built.compile_s + built.export_s
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
                fetched=program.build.fetched,
                fetch_s=program.build.fetch_s,
            )
        )
    return Measurement(tuple(measured), prefill_spec.label, prefill_compile_s, prefill_s)
