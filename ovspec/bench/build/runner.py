"""The build benchmark: what a ladder of specializations costs to build, key, import and
store, measured in one run side by side for weightless and full blobs.

Per specialization compile/export/import seconds and blob bytes; key derivation cold and
memoized; cold (empty store) vs warm (all hits) builds of the whole ladder; store bytes
of the ladder against one full blob and the model's weights. Asserts nothing on time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.bench.build.records import (
    NO_EVICTION_BYTES,
    BenchReport,
    KeyFigures,
    LadderFigures,
    RssMark,
    SpecFigures,
    StorageFigures,
)
from ovspec.bench.common.environment import (
    cpu_s,
    drop_from_page_cache,
    environment,
    load_average,
    peak_rss_bytes,
    tree_bytes,
)
from ovspec.bench.common.records import Spread
from ovspec.errors import BadRequestError, OvspecError, arg
from ovspec.ladder import Ladder


def _timed_key(compiler: Any, spec: Any) -> float:
    began = time.perf_counter()
    compiler.key(spec)
    return time.perf_counter() - began


# --------------------------------------------------------------------------- the bench


@dataclass(frozen=True)
class Settings:
    model_reference: str
    models_dir: Path
    ladder: Ladder
    phases: str
    chunk_tokens: int
    device: str
    properties: dict[str, str]
    repeats: int
    jobs: int
    work_dir: Path
    cli: bool

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise BadRequestError(f"{arg('repeats', str(self.repeats))} must be at least 1")
        if self.jobs < 1:
            raise BadRequestError(f"{arg('jobs', str(self.jobs))} must be at least 1")


class _Bench:
    """One benchmark run: scratch stores under ``scratch``, deleted by the caller."""

    def __init__(self, settings: Settings, scratch: Path, say: Callable[[str], None]) -> None:
        from ovspec.compile.modes import BlobMode
        from ovspec.compile.prewarm import BuildPlan, check_device, parse_phases
        from ovspec.ir.compression import Compression
        from ovspec.ir.model_dir import resolve_model

        self.settings = settings
        self.scratch = scratch
        self.say = say
        say(f"resolving model {settings.model_reference} (a built-in is written once)")
        self.model = resolve_model(settings.model_reference, settings.models_dir)
        self.plans = {
            mode: BuildPlan(
                model=self.model,
                ladder=settings.ladder,
                phases=parse_phases(settings.phases),
                chunk_tokens=settings.chunk_tokens,
                device=settings.device,
                properties=settings.properties,
                compression=Compression(),
                jobs=settings.jobs,
                blob_mode=mode,
            )
            for mode in (BlobMode.WEIGHTLESS, BlobMode.FULL)
        }
        self.plan = self.plans[BlobMode.WEIGHTLESS]
        check_device(self.plan)
        self.specs = self.plan.specializations()
        self.rss: list[RssMark] = []
        self._stores = 0

    def mark_rss(self, after: str) -> None:
        self.rss.append(RssMark(after, peak_rss_bytes()))

    @contextmanager
    def fresh_store(self, label: str) -> Iterator[Any]:
        from ovspec.store.local import Store

        self._stores += 1
        root = self.scratch / f"store-{self._stores:02d}-{label}"
        store = Store(root, strict=True, size_limit_bytes=NO_EVICTION_BYTES)
        try:
            yield store
        finally:
            store.close()
            shutil.rmtree(root, ignore_errors=True)

    def compiler(self, store: Any, mode: Any, memo: Any = None) -> Any:
        from ovspec.compile.compiler import Compiler

        plan = self.plans[mode]
        return Compiler(
            plan.model,
            plan.device,
            plan.properties,
            store,
            compression=plan.compression,
            memo=memo,
            blob_mode=mode,
        )

    # -- key derivation ---------------------------------------------------------------

    def keys(self) -> KeyFigures:
        from ovspec.compile.modes import BlobMode
        from ovspec.compile.preparing import prepare_model
        from ovspec.store.digests import DigestMemo

        first, second = self.specs[0], self.specs[-1]
        samples: dict[str, list[float]] = {}

        def add(name: str, value: float) -> None:
            samples.setdefault(name, []).append(value)

        for repeat in range(self.settings.repeats):
            self.say(f"key derivation {repeat + 1}/{self.settings.repeats}")
            with self.fresh_store("keys") as store:
                # First with the weights evicted from the page cache (a first run after a
                # reboot or a new model), then cached (the usual case on a dev machine).
                for attempt, uncached in enumerate((True, False)):
                    if uncached and not drop_from_page_cache(self.model.bin_path):
                        continue
                    memo = DigestMemo(store.root / f"digests-{attempt}")
                    began = time.perf_counter()
                    compiler = self.compiler(store, BlobMode.WEIGHTLESS, memo)
                    add("compiler_start", time.perf_counter() - began)
                    add("cold_uncached" if uncached else "cold_cached", _timed_key(compiler, first))
                    if memo.hashed_files != 2:
                        raise OvspecError(
                            f"a cold key hashed {memo.hashed_files} files, not the IR pair"
                        )
                    if not uncached:
                        add("next_key", _timed_key(compiler, second))
                        again = self.compiler(store, BlobMode.WEIGHTLESS, memo)
                        add("memo_memory", _timed_key(again, first))
                        disk_memo = DigestMemo(store.root / f"digests-{attempt}")
                        fresh = self.compiler(store, BlobMode.WEIGHTLESS, disk_memo)
                        add("memo_disk", _timed_key(fresh, first))
                        if disk_memo.hashed_files != 0:
                            raise OvspecError("the on-disk digest memo missed; figure is wrong")
                        fresh.close()
                    compiler.close()
            began = time.perf_counter()
            prepare_model(self.plan.model, self.plan.compression)
            add("prepare", time.perf_counter() - began)
        self.mark_rss("key derivation")
        dropped = samples.get("cold_uncached")
        return KeyFigures(
            weights_bytes=self.model.bin_path.stat().st_size,
            compiler_start_s=Spread.of(samples["compiler_start"]),
            cold_uncached_s=Spread.of(dropped) if dropped else None,
            cold_cached_s=Spread.of(samples["cold_cached"]),
            memo_memory_s=Spread.of(samples["memo_memory"]),
            memo_disk_s=Spread.of(samples["memo_disk"]),
            next_key_s=Spread.of(samples["next_key"]),
            prepare_s=Spread.of(samples["prepare"]),
        )

    # -- the ladder, cold and warm -------------------------------------------------------

    def ladders(self) -> tuple[tuple[LadderFigures, ...], tuple[SpecFigures, ...]]:
        from ovspec.compile.modes import BlobMode

        modes = (BlobMode.WEIGHTLESS, BlobMode.FULL)
        runs: dict[BlobMode, list[_LadderRun]] = {mode: [] for mode in modes}
        for repeat in range(self.settings.repeats):
            # AB/BA: neither mode always runs first (page cache, thermal, neighbours).
            order = modes if repeat % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                self.say(f"repeat {repeat + 1}/{self.settings.repeats}: {mode.value} ladder")
                runs[mode].append(self.ladder_once(mode))
                self.mark_rss(f"repeat {repeat + 1} {mode.value}")
        ladders = tuple(
            _ladder_figures(mode.value, runs[mode], self.settings.jobs) for mode in modes
        )
        specs = tuple(
            _spec_figures(mode.value, spec, i, runs[mode])
            for mode in modes
            for i, spec in enumerate(self.specs)
        )
        return ladders, specs

    def ladder_once(self, mode: Any) -> _LadderRun:
        from ovspec.compile.prewarm import run_build

        plan = self.plans[mode]
        with self.fresh_store(mode.value) as store:
            load_1m = load_average()[0]
            cpu_began = cpu_s()
            began = time.perf_counter()
            cold = run_build(plan, store)
            cold_s = time.perf_counter() - began
            cold_cpu_s = cpu_s() - cpu_began
            if cold.hits:
                raise OvspecError(f"{cold.hits} hits in a build into an empty store")

            began = time.perf_counter()
            warm = run_build(plan, store)
            warm_s = time.perf_counter() - began
            if warm.misses:
                raise OvspecError(f"{warm.misses} misses in a warm build; keys are unstable")

            load_began = time.perf_counter()
            compiler = self.compiler(store, mode)
            import_s: list[float] = []
            hit_s: list[float] = []
            try:
                for spec in self.specs:
                    began = time.perf_counter()
                    program = compiler.load(spec)
                    wall_s = time.perf_counter() - began
                    if not program.build.hit:
                        raise OvspecError(f"{spec.label} missed after a warm build")
                    import_s.append(program.import_s)
                    hit_s.append(wall_s - program.import_s)
                    # Dropped at once: a ladder of imported 0.5B programs would not fit
                    # beside other engineers' jobs, and a runtime holds one or two.
                    del program
            finally:
                compiler.close()
            warm_load_s = time.perf_counter() - load_began

            cli_s: float | None = None
            cli_error: str | None = None
            if self.settings.cli:
                cli_s, cli_error = self.cli_warm_build(store.root, mode)
            problems = tuple(store.check())
            return _LadderRun(
                cold_s=cold_s,
                cold_cpu_s=cold_cpu_s,
                load_1m=load_1m,
                compile_s=tuple(o.compile_s for o in cold.outcomes),
                export_s=tuple(o.export_s for o in cold.outcomes),
                blob_bytes=tuple(o.blob_bytes for o in cold.outcomes),
                warm_s=warm_s,
                warm_load_s=warm_load_s,
                import_s=tuple(import_s),
                hit_s=tuple(hit_s),
                cli_s=cli_s,
                cli_error=cli_error,
                store_bytes=tree_bytes(store.root),
                problems=problems,
            )

    def cli_warm_build(self, root: Path, mode: Any) -> tuple[float | None, str | None]:
        """``ovspec build`` in a new process on a warm store: what a user waits for."""
        s = self.settings
        command = [
            sys.executable,
            "-c",
            "from ovspec.cli import main; main()",
            "build",
            str(self.model.root),
            "--ladder",
            str(s.ladder),
            "--phases",
            s.phases,
            "--chunk",
            str(s.chunk_tokens),
            "--device",
            s.device,
            *(arg for k, v in s.properties.items() for arg in ("--config", f"{k}={v}")),
            "--blob-mode",
            mode.value,
            "--cache-dir",
            str(root),
            "--json",
        ]
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall_s = time.perf_counter() - began
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"exit {done.returncode}: {last}"
        try:
            entries = json.loads(done.stdout)["entries"]
            misses = sum(not e["hit"] for e in entries)
        except (ValueError, KeyError, TypeError):
            return wall_s, "could not read the JSON it printed; hits unchecked"
        if misses:
            return None, f"{misses} misses: the CLI derives other keys than run_build"
        return wall_s, None


@dataclass(frozen=True)
class _LadderRun:
    cold_s: float
    cold_cpu_s: float
    load_1m: float
    compile_s: tuple[float, ...]
    export_s: tuple[float, ...]
    blob_bytes: tuple[int, ...]
    warm_s: float
    warm_load_s: float
    import_s: tuple[float, ...]
    hit_s: tuple[float, ...]
    cli_s: float | None
    cli_error: str | None
    store_bytes: int
    problems: tuple[str, ...]


def _ladder_figures(mode: str, runs: Sequence[_LadderRun], jobs: int) -> LadderFigures:
    cli = [r.cli_s for r in runs if r.cli_s is not None]
    errors = [r.cli_error for r in runs if r.cli_error]
    return LadderFigures(
        blob_mode=mode,
        specializations=len(runs[0].compile_s),
        cold_build_s=Spread.of([r.cold_s for r in runs]),
        cold_compile_s=Spread.of([sum(r.compile_s) for r in runs]),
        cold_export_s=Spread.of([sum(r.export_s) for r in runs]),
        cold_other_s=(
            Spread.of([r.cold_s - sum(r.compile_s) - sum(r.export_s) for r in runs])
            if jobs == 1
            else None
        ),
        cold_cpu_s=Spread.of([r.cold_cpu_s for r in runs]),
        warm_build_s=Spread.of([r.warm_s for r in runs]),
        cold_over_warm=Spread.of([r.cold_s / r.warm_s for r in runs]),
        warm_load_s=Spread.of([r.warm_load_s for r in runs]),
        cold_over_warm_load=Spread.of([r.cold_s / r.warm_load_s for r in runs]),
        cli_warm_build_s=Spread.of(cli) if cli else None,
        cli_error=errors[0] if errors else None,
        blob_bytes=sum(runs[0].blob_bytes),
        store_bytes=max(r.store_bytes for r in runs),
        largest_blob_bytes=max(runs[0].blob_bytes),
        check_problems=tuple(p for r in runs for p in r.problems),
        load_average_1m=tuple(r.load_1m for r in runs),
    )


def _spec_figures(mode: str, spec: Any, i: int, runs: Sequence[_LadderRun]) -> SpecFigures:
    return SpecFigures(
        blob_mode=mode,
        specialization=spec.label,
        phase=spec.phase.value,
        capacity_tokens=spec.capacity_tokens,
        chunk_tokens=spec.chunk_tokens,
        compile_s=Spread.of([r.compile_s[i] for r in runs]),
        export_s=Spread.of([r.export_s[i] for r in runs]),
        blob_bytes=tuple(r.blob_bytes[i] for r in runs),
        import_s=Spread.of([r.import_s[i] for r in runs]),
        hit_s=Spread.of([r.hit_s[i] for r in runs]),
    )


def _storage(model_bin_bytes: int, specs: Sequence[SpecFigures], top: int) -> StorageFigures:
    def ladder(mode: str) -> int | None:
        rows = [s for s in specs if s.blob_mode == mode]
        return sum(s.blob_bytes[0] for s in rows) if rows else None

    top_full = [
        s.blob_bytes[0] for s in specs if s.blob_mode == "full" and s.capacity_tokens == top
    ]
    return StorageFigures(
        model_bin_bytes=model_bin_bytes,
        weightless_ladder_bytes=ladder("weightless"),
        full_ladder_bytes=ladder("full"),
        one_full_blob_bytes=max(top_full) if top_full else None,
    )


def run_benchmark(settings: Settings, command: str, say: Callable[[str], None]) -> BenchReport:
    began = time.perf_counter()
    load_start = load_average()
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ovspec-bench-", dir=settings.work_dir))
    try:
        bench = _Bench(settings, scratch, say)
        keys = bench.keys()
        ladders, specs = bench.ladders()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    bench.mark_rss("the whole run")
    return BenchReport(
        command=command,
        environment=environment(load_start),
        model=str(bench.model.root),
        model_reference=settings.model_reference,
        ladder=tuple(settings.ladder),
        phases=tuple(p.value for p in bench.plan.phases),
        chunk_tokens=settings.chunk_tokens,
        device=settings.device,
        properties=dict(settings.properties),
        repeats=settings.repeats,
        jobs=settings.jobs,
        keys=keys,
        specs=specs,
        ladders=ladders,
        storage=_storage(keys.weights_bytes, specs, settings.ladder.top_tokens),
        rss=tuple(bench.rss),
        duration_s=time.perf_counter() - began,
    )
