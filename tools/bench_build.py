#!/usr/bin/env python3
"""Build benchmark: what a ladder of specializations costs to build, key, import and store.

Measures, in one run and side by side for weightless and full blobs: per specialization
compile/export/import seconds and blob bytes; key derivation cold and memoized; cold
(empty store) vs warm (all hits) builds of the whole ladder; store bytes of the ladder
against one full blob and the model's weights. Prints figures; asserts nothing on time.

    python tools/bench_build.py --repeats 3            # ~0.5B-shaped built-in model
    python tools/bench_build.py --model /path/to/ir --json
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ovspec.cli.options import chunk_option, device_options, ladder_option, phases_option
from ovspec.compile.host import cpu_model
from ovspec.errors import BadRequestError, OvspecError
from ovspec.ladder import Ladder

# History: 1 — first format (2026-11).
REPORT_FORMAT_VERSION = 1

DEFAULT_MODELS_DIR = Path(tempfile.gettempdir()) / "ovspec-bench-models"
# The bench stores must never evict mid-run: a full-blob ladder of a 7B model exceeds
# the store's default 20 GiB limit, and an eviction would turn warm hits into misses.
_NO_EVICTION_BYTES = 2**50


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements of one quantity (seconds or a ratio)."""

    n: int
    median: float
    low: float
    high: float
    samples: tuple[float, ...]  # in measurement order (repeat 1 first)

    def __post_init__(self) -> None:
        if self.n < 1 or self.n != len(self.samples) or not self.low <= self.median <= self.high:
            raise ValueError(f"inconsistent spread {self}")

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise ValueError("a spread needs at least one sample")
        return cls(
            len(samples), statistics.median(samples), min(samples), max(samples), tuple(samples)
        )

    def text(self, digits: int = 3) -> str:
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}–{self.high:.{digits}f})"


@dataclass(frozen=True)
class Environment:
    """Where the figures were measured; a figure is never read without it."""

    date_utc: str
    cpu_model: str
    logical_cores: int
    usable_cores: int
    memory_bytes: int
    os: str
    python: str
    openvino: str
    ovspec: str
    git_commit: str
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]


@dataclass(frozen=True)
class KeyFigures:
    """Key derivation of the first specialization; the rest share the static part."""

    weights_bytes: int
    compiler_start_s: Spread  # ov.Core() + device facts (CPU: a one-op probe compile)
    cold_uncached_s: Spread | None  # empty memo, .bin evicted from the page cache
    cold_cached_s: Spread  # empty memo, .bin in the page cache: hashes the weights
    memo_memory_s: Spread  # new Compiler, same in-memory digest memo
    memo_disk_s: Spread  # new Compiler, new memo object over the on-disk memo
    next_key_s: Spread  # same Compiler, another specialization (static part cached)
    prepare_s: Spread  # read the IR + stateful->stateless + new-token outputs


@dataclass(frozen=True)
class SpecFigures:
    blob_mode: str
    specialization: str
    phase: str
    capacity_tokens: int
    chunk_tokens: int
    compile_s: Spread
    export_s: Spread
    blob_bytes: tuple[int, ...]  # one per repeat (equal unless export is not deterministic)
    import_s: Spread  # Program.import_s: import from the store's memory-mapped file
    hit_s: Spread  # Compiler.load wall minus import: key + lookup + checksum + touch


@dataclass(frozen=True)
class LadderFigures:
    """The whole ladder in one blob mode, cold (empty store) and warm (all hits)."""

    blob_mode: str
    specializations: int
    cold_build_s: Spread  # run_build on an empty store, Compiler start included
    cold_compile_s: Spread  # summed over the specializations (overlapping if jobs > 1)
    cold_export_s: Spread
    # Keys, IR preparation, store commits (fsync, checksum, index); None if jobs > 1,
    # where the sums above overlap in time and a difference means nothing.
    cold_other_s: Spread | None
    # Process CPU seconds (user+sys) of the cold build: on 2 shared cores, a wall that
    # grows while this stays put means a neighbour took the CPU, not that ovspec slowed.
    cold_cpu_s: Spread
    warm_build_s: Spread  # run_build again on the same store: all hits
    cold_over_warm: Spread  # paired per repeat
    warm_load_s: Spread  # fresh Compiler: load (hit + import) every specialization
    cold_over_warm_load: Spread
    cli_warm_build_s: Spread | None  # `ovspec build` in a new process, all hits
    cli_error: str | None
    blob_bytes: int  # sum of the ladder's blobs
    store_bytes: int  # every file under the store root (blobs, sidecars, index, memo)
    largest_blob_bytes: int
    check_problems: tuple[str, ...]  # Store.check() at the end of each repeat
    load_average_1m: tuple[float, ...]  # at the start of each repeat's cold build


@dataclass(frozen=True)
class StorageFigures:
    model_bin_bytes: int
    weightless_ladder_bytes: int | None
    full_ladder_bytes: int | None
    one_full_blob_bytes: int | None  # the largest full blob of the top rung

    @property
    def weights_copies_full(self) -> float | None:
        """Full ladder bytes in units of the model's weights: ~rungs x phases."""
        if self.full_ladder_bytes is None:
            return None
        return self.full_ladder_bytes / self.model_bin_bytes

    @property
    def full_over_weightless(self) -> float | None:
        if self.full_ladder_bytes is None or not self.weightless_ladder_bytes:
            return None
        return self.full_ladder_bytes / self.weightless_ladder_bytes


@dataclass(frozen=True)
class RssMark:
    after: str
    peak_rss_bytes: int


@dataclass(frozen=True)
class BenchReport:
    command: str
    environment: Environment
    model: str
    model_reference: str
    ladder: tuple[int, ...]
    phases: tuple[str, ...]
    chunk_tokens: int
    device: str
    properties: dict[str, str]
    repeats: int
    jobs: int
    keys: KeyFigures
    specs: tuple[SpecFigures, ...]
    ladders: tuple[LadderFigures, ...]
    storage: StorageFigures
    rss: tuple[RssMark, ...]
    duration_s: float
    format_version: int = REPORT_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["storage"]["weights_copies_full"] = self.storage.weights_copies_full
        doc["storage"]["full_over_weightless"] = self.storage.full_over_weightless
        return doc


# --------------------------------------------------------------------------- environment


def _git_commit() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' (dirty)' if dirty else ''}"


def _load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def _environment(load_start: tuple[float, float, float]) -> Environment:
    import openvino as ov

    from ovspec import __version__

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return Environment(
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        cpu_model=cpu_model(),
        logical_cores=os.cpu_count() or 0,
        usable_cores=usable,
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        os=platform.platform(),
        python=platform.python_version(),
        openvino=str(ov.get_version()),
        ovspec=__version__,
        git_commit=_git_commit(),
        load_average_start=load_start,
        load_average_end=_load_average(),
    )


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except FileNotFoundError:
                continue  # a lock or temp vanished while walking
    return total


def _drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to forget a file's cached pages (best effort, no root needed)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


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
            raise BadRequestError(f"--repeats {self.repeats} must be at least 1")
        if self.jobs < 1:
            raise BadRequestError(f"--jobs {self.jobs} must be at least 1")


class _Bench:
    """One benchmark run: scratch stores under ``scratch``, deleted by the caller."""

    def __init__(self, settings: Settings, scratch: Path, say: Callable[[str], None]) -> None:
        from ovspec.compile.compiler import BlobMode
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
        self.rss.append(RssMark(after, _peak_rss_bytes()))

    @contextmanager
    def fresh_store(self, label: str) -> Iterator[Any]:
        from ovspec.store.local import Store

        self._stores += 1
        root = self.scratch / f"store-{self._stores:02d}-{label}"
        store = Store(root, strict=True, size_limit_bytes=_NO_EVICTION_BYTES)
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
        from ovspec.compile.compiler import BlobMode, prepare_model
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
                    if uncached and not _drop_from_page_cache(self.model.bin_path):
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
        from ovspec.compile.compiler import BlobMode

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
            load_1m = _load_average()[0]
            cpu_began = _cpu_s()
            began = time.perf_counter()
            cold = run_build(plan, store)
            cold_s = time.perf_counter() - began
            cold_cpu_s = _cpu_s() - cpu_began
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
                store_bytes=_tree_bytes(store.root),
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
    load_start = _load_average()
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
        environment=_environment(load_start),
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


# --------------------------------------------------------------------------- text output


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def format_report(r: BenchReport) -> str:
    env, k, st = r.environment, r.keys, r.storage
    out = [
        "ovspec build benchmark",
        f"command: {r.command}",
        f"date: {env.date_utc}   duration: {r.duration_s / 60:.1f} min",
        f"machine: {env.cpu_model}, {env.logical_cores} logical cores "
        f"({env.usable_cores} usable), {_gib(env.memory_bytes)} RAM, {env.os}",
        f"software: OpenVINO {env.openvino}, Python {env.python}, "
        f"ovspec {env.ovspec} (git {env.git_commit})",
        "load average (1/5/15 min) at start: "
        + "/".join(f"{x:.2f}" for x in env.load_average_start)
        + ", at end: "
        + "/".join(f"{x:.2f}" for x in env.load_average_end),
        f"model: {r.model_reference} -> {r.model}",
        f"       weights (.bin) {k.weights_bytes:,} B = {_mib(k.weights_bytes)}",
        f"ladder {','.join(map(str, r.ladder))} x {','.join(r.phases)} (chunk {r.chunk_tokens}) "
        f"on {r.device}, config {_properties_text(r.properties)}, jobs {r.jobs}, "
        f"repeats {r.repeats}",
        "figures: median (min–max) over the repeats; seconds unless marked",
        "",
        "Per specialization (cold compile/export; import and hit from a warm store)",
    ]
    rows = [
        [
            s.blob_mode,
            s.specialization,
            s.compile_s.text(2),
            s.export_s.text(3),
            f"{s.blob_bytes[0]:,}"
            + ("" if len(set(s.blob_bytes)) == 1 else f" (to {max(s.blob_bytes):,})"),
            s.import_s.text(3),
            s.hit_s.text(4),
        ]
        for s in r.specs
    ]
    out += _table(
        ["mode", "specialization", "compile s", "export s", "blob bytes", "import s", "hit s"],
        rows,
    )
    hash_gb_s = k.weights_bytes / 1e9 / k.cold_cached_s.median
    out += [
        "",
        "Key derivation (first key of a Compiler unless noted)",
        *_table(
            ["case", "seconds"],
            [
                ["Compiler start (ov.Core + device facts)", k.compiler_start_s.text(4)],
                [
                    "cold: empty memo, .bin dropped from page cache",
                    k.cold_uncached_s.text(4) if k.cold_uncached_s else "n/a",
                ],
                [
                    f"cold: empty memo, .bin cached ({hash_gb_s:.1f} GB/s)",
                    k.cold_cached_s.text(4),
                ],
                ["warm: new Compiler, memo in memory", k.memo_memory_s.text(5)],
                ["warm: new Compiler, new memo object on disk", k.memo_disk_s.text(5)],
                ["next key, same Compiler", k.next_key_s.text(6)],
                ["(IR read + prepare, for scale)", k.prepare_s.text(3)],
            ],
        ),
        "",
    ]
    n = r.ladders[0].specializations if r.ladders else 0
    ladder_rows: list[tuple[str, Callable[[LadderFigures], str]]] = [
        ("cold build s (empty store)", lambda f: f.cold_build_s.text(2)),
        ("  sum of compile s", lambda f: f.cold_compile_s.text(2)),
        ("  sum of export s", lambda f: f.cold_export_s.text(2)),
        (
            "  other s (keys, IR, store commits)",
            lambda f: f.cold_other_s.text(2) if f.cold_other_s else "n/a (jobs > 1)",
        ),
        ("  process CPU s (user+sys)", lambda f: f.cold_cpu_s.text(1)),
        ("warm build s (all hits)", lambda f: f.warm_build_s.text(4)),
        ("cold / warm build", lambda f: f.cold_over_warm.text(0)),
        ("warm load s (hit + import, each)", lambda f: f.warm_load_s.text(2)),
        ("cold / warm load", lambda f: f.cold_over_warm_load.text(1)),
        (
            "warm `ovspec build`, new process s",
            lambda f: f.cli_warm_build_s.text(2) if f.cli_warm_build_s else "n/a",
        ),
        ("ladder blob bytes", lambda f: f"{f.blob_bytes:,}"),
        ("store bytes on disk (all files)", lambda f: f"{f.store_bytes:,}"),
        (
            "load average (1 min) at each cold start",
            lambda f: " ".join(f"{x:.1f}" for x in f.load_average_1m),
        ),
    ]
    out += [f"Whole ladder ({n} specializations), one fresh store per repeat"]
    out += _table(
        ["", *(f.blob_mode for f in r.ladders)],
        [[name, *(get(f) for f in r.ladders)] for name, get in ladder_rows],
    )
    for f in r.ladders:
        if f.cli_error:
            out.append(f"  note: `ovspec build` ({f.blob_mode}): {f.cli_error}")
        if f.check_problems:
            out.append(f"  store.check() ({f.blob_mode}): {'; '.join(f.check_problems)}")
    out += ["", "Storage"]
    storage_rows = [["model weights (.bin)", f"{st.model_bin_bytes:,}", _mib(st.model_bin_bytes)]]
    for name, value in (
        ("weightless ladder (blobs)", st.weightless_ladder_bytes),
        ("full ladder (blobs)", st.full_ladder_bytes),
        (f"one full blob, top rung {r.ladder[-1]}", st.one_full_blob_bytes),
    ):
        if value is not None:
            storage_rows.append([name, f"{value:,}", _mib(value)])
    out += _table(["", "bytes", ""], storage_rows)
    if st.weights_copies_full is not None and st.weightless_ladder_bytes is not None:
        out.append(
            f"full ladder / .bin = {st.weights_copies_full:.2f} for {n} specializations; "
            f"(weightless ladder + .bin) / .bin = "
            f"{(st.weightless_ladder_bytes + st.model_bin_bytes) / st.model_bin_bytes:.3f}"
        )
    if st.full_over_weightless is not None:
        out.append(f"full / weightless ladder bytes = {st.full_over_weightless:,.0f}")
    out += ["", "Peak RSS of this process (monotonic)"]
    out += [f"  after {m.after}: {_gib(m.peak_rss_bytes)}" for m in r.rss]
    return "\n".join(out)


# --------------------------------------------------------------------------- command line


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--model",
    "model_reference",
    default="builtin:qwen2.5-0.5b",
    show_default=True,
    help="Model folder, or builtin:PRESET (written once under --models-dir).",
)
@click.option(
    "--models-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODELS_DIR,
    show_default=True,
    help="Where built-in models are written and reused between runs.",
)
@ladder_option
@phases_option
@chunk_option
@device_options
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Cold/warm ladder builds per blob mode (each in a fresh store).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Specializations compiled at once in a cold build (as `ovspec build --jobs`); "
    "above 1 the per-specialization compile seconds include sharing the cores.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(tempfile.gettempdir()),
    show_default=True,
    help="Where the scratch stores go (deleted afterwards); a full ladder needs ~rungs x "
    "phases x the .bin size.",
)
@click.option(
    "--cli/--no-cli",
    default=True,
    show_default=True,
    help="Also time a warm `ovspec build` in a new process.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON document to this file (the table still goes to stdout).",
)
def main(
    model_reference: str,
    models_dir: Path,
    ladder: Ladder,
    phases: str,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    repeats: int,
    jobs: int,
    work_dir: Path,
    cli: bool,
    as_json: bool,
    json_out: Path | None,
) -> None:
    """Benchmark building a ladder of specializations: compile, export, import, keys,
    cold vs warm builds and store bytes, weightless vs full blobs. Progress goes to
    stderr, figures to stdout."""
    settings = Settings(
        model_reference=model_reference,
        models_dir=models_dir,
        ladder=ladder,
        phases=phases,
        chunk_tokens=chunk_tokens,
        device=device,
        properties=dict(config),
        repeats=repeats,
        jobs=jobs,
        work_dir=work_dir,
        cli=cli,
    )
    command = shlex.join(["python", "tools/bench_build.py", *sys.argv[1:]])
    started = time.perf_counter()

    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:7.1f} s] {message}", err=True)

    try:
        report = run_benchmark(settings, command, say)
    except OvspecError as exc:
        click.echo(f"bench_build: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    document = json.dumps(report.to_json(), indent=2)
    if json_out is not None:
        json_out.write_text(document + "\n", encoding="utf-8")
    if as_json:
        click.echo(document)
    else:
        click.echo(format_report(report))


def _properties_text(properties: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in properties.items()) or "none"


if __name__ == "__main__":
    main()
