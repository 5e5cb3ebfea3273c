"""The ``ovspec plan`` workflow: per-rung costs from the caller's values, the store's
history of this model's builds, or a short measured decode per rung; then the one-ahead
plan with and without early starts, and the conclusion. ``plan`` is the deadline model
it runs; the CLI parses the request and renders the ``PlanReport``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ovspec.compile.modes import BlobMode
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import AutoCosts, Decision, Lanes, Request, choose
from ovspec.runtime.costs import DEFAULT_MEASURE_STEPS
from ovspec.runtime.plan import Plan, RungCosts, RungValues, conclusion, plan_one_ahead
from ovspec.runtime.plan import rungs_needed as _rungs_needed
from ovspec.runtime.schedule import EarlyStartRule

if TYPE_CHECKING:
    from ovspec.ir.model_dir import ModelDir
    from ovspec.store.local import Store

DEFAULT_PROMPT_TOKENS = 128
DEFAULT_CHUNK_TOKENS = 128


@dataclass(frozen=True)
class PlanRequest:
    """What to plan and where each cost comes from. ``compile_s`` (seconds) and
    ``decode_ms`` (milliseconds per step) are per-rung values; a missing ``compile_s``
    is read from the store's history (or measured, with ``measure``); a missing
    ``decode_ms`` is always measured."""

    model: str  # a folder, a .gguf file or builtin:PRESET; read only through the store
    ladder: Ladder
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    new_tokens: int | None = None  # None: up to the top rung
    device: str = "CPU"
    properties: Mapping[str, str] = field(default_factory=dict)
    compression: Compression = field(default_factory=Compression)
    blob_mode: BlobMode = BlobMode.WEIGHTLESS
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    compile_s: RungValues | None = None
    decode_ms: RungValues | None = None
    measure: bool = False
    measure_steps: int = DEFAULT_MEASURE_STEPS
    early_start: bool = True
    rule: EarlyStartRule = EarlyStartRule.LATEST_START
    load_mode: str | None = None  # None: the device's default
    lanes: Lanes = field(default_factory=Lanes)  # builds at once, for auto's schedule

    def __post_init__(self) -> None:
        if self.decode_ms is not None and self.measure:
            raise BadRequestError(
                f"{arg('decode_ms')} and {arg('measure')} both give the decode rate; choose one"
            )
        if self.prompt_tokens < 1:
            raise BadRequestError(f"{arg('prompt_tokens')} must be at least 1")
        _given_costs(self, self.rungs_needed())  # the values given fit the ladder

    @property
    def measures(self) -> bool:
        """Whether decode steps may be timed: asked for, or no decode rate was given
        (then the store's recorded step times serve if it has every rung's)."""
        return self.measure or self.decode_ms is None

    @property
    def reads_store(self) -> bool:
        """Whether a cost comes from the store (its history or a measurement through it)."""
        return self.measures or self.compile_s is None

    @property
    def planned_new_tokens(self) -> int:
        if self.new_tokens is not None:
            return self.new_tokens
        return max(self.ladder.top_tokens - self.prompt_tokens, 0)

    def rungs_needed(self) -> tuple[int, ...]:
        return _rungs_needed(self.ladder, self.prompt_tokens, self.planned_new_tokens)


@dataclass(frozen=True)
class PlanReport:
    """A plan and where its numbers came from."""

    request: PlanRequest
    model: str  # the model's folder when it was read, else as the request gave it
    costs: RungCosts
    sources: Mapping[str, str]  # "compile", "decode" and maybe "fetch": where each came from
    details: Mapping[int, Mapping[str, object]]  # per rung: "history" or "measured" records
    prefill_note: str  # where the prefill graph's cost came from
    one_ahead: Plan  # pure one-ahead, no early start
    planned: Plan | None  # with early starts under the request's rule; None when off
    conclusion: str
    auto: Decision | None = None  # auto's schedule on the same costs (None: it has none)
    auto_note: str = ""  # why there is no auto schedule

    @property
    def shown(self) -> Plan:
        """The plan a run would follow: with early starts unless they are off."""
        return self.planned if self.planned is not None else self.one_ahead

    def to_json(self) -> dict[str, object]:
        shown, costs = self.shown, self.costs
        return {
            "model": self.model,
            "device": self.request.device,
            "ladder": list(self.request.ladder),
            "prompt_tokens": self.request.prompt_tokens,
            "new_tokens": self.request.planned_new_tokens,
            "sources": dict(self.sources),
            "prefill_compile_s": costs.prefill_compile_s,
            "prefill_s": costs.prefill_s,
            "rungs": [
                {
                    "capacity_tokens": r,
                    "compile_s": costs.compile_s.get(r),
                    "fetch_s": costs.fetch_s.get(r),
                    "decode_s_per_token": costs.decode_s_per_token.get(r),
                    "window_s": shown.window_s.get(r),
                    **self.details.get(r, {}),
                }
                for r in self.request.ladder
                if r in costs.compile_s or r in costs.decode_s_per_token
            ],
            "plan": shown.to_json(),
            "one_ahead": self.one_ahead.to_json(),
            "conclusion": self.conclusion,
            "auto": self.auto.to_json() if self.auto is not None else {"note": self.auto_note},
        }


@dataclass
class _Gathered:
    """The costs as they are found, source by source (the caller's, then the store's)."""

    compile_s: dict[int, float] | None
    decode_s: dict[int, float] | None
    sources: dict[str, str]
    details: dict[int, dict[str, object]]
    fetch_s: dict[int, float] = field(default_factory=dict)
    prefill_compile_s: float = 0.0
    prefill_s: float = 0.0
    prefill_note: str = "prefill graph: not in --compile-s, counted 0"
    model: str | None = None


def make_plan(
    request: PlanRequest,
    store: Store | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> PlanReport:
    """Gather the costs and plan. ``store`` is needed when ``request.reads_store``: it
    holds the history, and a measurement loads (and builds what is missing) through it.
    ``on_progress`` hears what a measurement is doing."""
    rungs = request.rungs_needed()
    gathered = _given_costs(request, rungs)
    if request.reads_store:
        if store is None:
            raise BadRequestError(
                f"planning {request.model} needs a store: give {arg('store')}, or give "
                f"{arg('compile_s')} and {arg('decode_ms')}"
            )
        _store_costs(request, store, rungs, gathered, on_progress)
    assert gathered.compile_s is not None and gathered.decode_s is not None
    costs = RungCosts(
        gathered.compile_s,
        gathered.decode_s,
        gathered.prefill_compile_s,
        gathered.prefill_s,
        gathered.fetch_s,
    )
    new = request.planned_new_tokens
    one_ahead = plan_one_ahead(request.ladder, request.prompt_tokens, new, costs, False)
    planned: Plan | None = None
    better: Plan | None = None
    if request.early_start:
        rule = request.rule
        planned = plan_one_ahead(request.ladder, request.prompt_tokens, new, costs, True, rule)
        other = (
            EarlyStartRule.LATEST_START if rule is EarlyStartRule.WINDOW else EarlyStartRule.WINDOW
        )
        better = plan_one_ahead(request.ladder, request.prompt_tokens, new, costs, True, other)
    auto, auto_note = _auto_decision(request, costs)
    return PlanReport(
        request=request,
        model=gathered.model or request.model,
        costs=costs,
        sources=gathered.sources,
        details=gathered.details,
        prefill_note=gathered.prefill_note,
        one_ahead=one_ahead,
        planned=planned,
        conclusion=conclusion(one_ahead, planned, better),
        auto=auto,
        auto_note=auto_note,
    )


def _auto_decision(request: PlanRequest, costs: RungCosts) -> tuple[Decision | None, str]:
    """What ``policy="auto"`` would run on these costs (no interference term: the plan's
    costs do not measure it), or why it cannot say."""
    prompt_rung = request.ladder.rung_for(request.prompt_tokens)
    auto_costs = AutoCosts.from_rung_costs(costs, prompt_rung)
    asked = Request(request.prompt_tokens, request.planned_new_tokens)
    try:
        return choose(request.ladder, asked, auto_costs, request.lanes), ""
    except BadRequestError as exc:
        return None, str(exc)


def _given_costs(request: PlanRequest, rungs: tuple[int, ...]) -> _Gathered:
    """The costs the request gives itself, checked against the ladder."""
    ladder = request.ladder
    compile_s = decode_s = None
    sources: dict[str, str] = {}
    if request.compile_s is not None:
        compile_s = request.compile_s.resolve(rungs, ladder, arg("compile_s"))
        sources["compile"] = "--compile-s"
    if request.decode_ms is not None:
        per_rung = request.decode_ms.resolve(rungs, ladder, arg("decode_ms"))
        decode_s = {r: ms / 1000 for r, ms in per_rung.items()}
        sources["decode"] = "--decode-ms"
    return _Gathered(compile_s, decode_s, sources, {r: {} for r in ladder})


def _store_costs(
    request: PlanRequest,
    store: Store,
    rungs: tuple[int, ...],
    gathered: _Gathered,
    on_progress: Callable[[str], None] | None,
) -> None:
    from ovspec.ir.model_dir import resolve_model

    model_dir = resolve_model(request.model, store.models_folder)
    gathered.model = str(model_dir.root)
    request.ladder.check_fits(model_dir.max_position_embeddings)
    if request.measure:
        _measured_costs(request, store, rungs, gathered, on_progress)
    elif request.decode_ms is not None:
        _history_costs(request, store, model_dir, rungs, gathered)
    elif not _recorded(request, store, model_dir, rungs, gathered):
        _measured_costs(request, store, rungs, gathered, on_progress)


def _recorded(
    request: PlanRequest,
    store: Store,
    model_dir: ModelDir,
    rungs: tuple[int, ...],
    gathered: _Gathered,
) -> bool:
    """Whether the store's history has everything a plan needs, the decode step times
    past runs recorded included; if so ``gathered`` holds it, else it is unchanged."""
    trial = _Gathered(
        gathered.compile_s, None, dict(gathered.sources), {r: {} for r in request.ladder}
    )
    try:
        _history_costs(request, store, model_dir, rungs, trial)
    except BadRequestError:
        return False
    if trial.decode_s is None:
        return False
    for name in (
        "compile_s",
        "decode_s",
        "sources",
        "details",
        "fetch_s",
        "prefill_compile_s",
        "prefill_note",
    ):
        setattr(gathered, name, getattr(trial, name))
    return True


def _measured_costs(
    request: PlanRequest,
    store: Store,
    rungs: tuple[int, ...],
    gathered: _Gathered,
    on_progress: Callable[[str], None] | None,
) -> None:
    """Each rung made ready through the store and a short decode timed on it (an
    on-demand loader: nothing compiles behind the measurement)."""
    from ovspec.compile.modes import LoadMode
    from ovspec.runtime.costs import measure
    from ovspec.runtime.decoding import open_rungs as open_loader
    from ovspec.runtime.loader import Policy

    with open_loader(
        request.model,
        request.ladder,
        device=request.device,
        properties=dict(request.properties),
        store=store,
        policy=Policy.ON_DEMAND,
        prefill_chunk_tokens=request.chunk_tokens,
        compression=request.compression,
        blob_mode=request.blob_mode,
        load_mode=request.load_mode,
    ) as loader:
        measured = measure(
            loader, rungs, request.prompt_tokens, request.measure_steps, on_progress=on_progress
        )
        stored = loader.load_mode is LoadMode.IMPORT  # else compiled from the IR, unstored
    for m in measured.rungs:
        gathered.details[m.capacity_tokens]["measured"] = {
            "store_hit": m.store_hit,
            "compile_s": m.compile_s,
            "export_s": m.export_s,
            "import_s": m.import_s,
            "decode_s_per_token": m.decode_s_per_token,
            "decode_mean_s_per_token": m.decode_mean_s_per_token,
            "steps": m.steps,
            "fetched": m.fetched,
            "fetch_s": m.fetch_s,
        }
    gathered.prefill_s = measured.prefill_s
    gathered.decode_s = {m.capacity_tokens: m.decode_s_per_token for m in measured.rungs}
    gathered.sources["decode"] = (
        f"measured: median of {request.measure_steps} decode steps per rung; "
        f"prefill of {request.prompt_tokens} tokens {measured.prefill_s:.3f} s"
    )
    if gathered.compile_s is None:
        costs = measured.costs()
        gathered.compile_s = dict(costs.compile_s)
        gathered.fetch_s = dict(costs.fetch_s)
        gathered.prefill_compile_s = measured.prefill_compile_s
        gathered.prefill_note = (
            f"{measured.prefill_label} {measured.prefill_compile_s:.3f} s measured"
        )
        gathered.sources["compile"] = _measured_compile_source(stored)


def _measured_compile_source(stored: bool) -> str:
    """Where measured compile costs came from: builds into the store (import mode), or
    compiles from the IR that store nothing (the CPU's rung graphs)."""
    if stored:
        return (
            "measured: store build (compile + export; the recorded ones on a hit) + import just now"
        )
    return (
        "measured: compiled from the IR just now (nothing stored; "
        "--load-mode import builds into the store)"
    )


def _history_costs(
    request: PlanRequest,
    store: Store,
    model_dir: ModelDir,
    rungs: tuple[int, ...],
    gathered: _Gathered,
) -> None:
    """Each rung's recorded compile + export from the store's index (exact: the same
    model, device, properties and compression), and its fetch where a remote holds it."""
    from ovspec.compile.compiler import Compiler
    from ovspec.runtime.costs import history

    compiler = Compiler(
        model_dir,
        request.device,
        dict(request.properties),
        store,
        compression=request.compression,
        blob_mode=request.blob_mode,
    )
    try:
        recorded = history(compiler, request.ladder, rungs, request.chunk_tokens)
    finally:
        compiler.close()
    if gathered.compile_s is None:
        gathered.compile_s = recorded.ready_s()
    steps = recorded.steps
    gathered.fetch_s = {
        r: fetch_s + (steps[r].import_s if r in steps else 0.0)
        for r, fetch_s in recorded.fetch_s().items()
    }
    if gathered.decode_s is None and all(r in steps for r in rungs):
        gathered.decode_s = recorded.decode_s_per_token()
        runs = min(steps[r].runs for r in rungs)
        gathered.sources["decode"] = (
            f"store history: decode seconds per token recorded by past runs (median of "
            f"the last {runs} or more per rung)"
        )
        for r in rungs:
            gathered.details[r]["recorded_decode_s_per_token"] = steps[r].decode_s_per_token
    for r, record in recorded.decode.items():
        gathered.details[r]["history"] = {
            "key": record.key_hex,
            "compile_s": record.compile_s,
            "export_s": record.export_s,
            "blob_bytes": record.blob_bytes,
            "on_remote": record.on_remote,
            "recorded_import_s": steps[r].import_s if r in steps else None,
        }
    prefill_ready = recorded.prefill_ready_s()
    if recorded.prefill is not None and prefill_ready is not None:
        gathered.prefill_compile_s = prefill_ready
        gathered.prefill_note = f"{recorded.prefill.label} {prefill_ready:.3f} s"
    else:
        gathered.prefill_note = "prefill graph: not in the history, counted 0"
    gathered.sources["compile"] = (
        "store history: recorded compile + export, plus the import past runs recorded "
        "per rung (step-times.json; 0 for a rung no run has imported yet)"
    )
    if store.tier is not None:
        on_remote = [r for r, rec in recorded.decode.items() if rec.on_remote]
        rate = recorded.fetch_bytes_per_s
        gathered.sources["fetch"] = f"{len(on_remote)} rungs on {store.tier.location}; " + (
            f"fetch = bytes / {rate / 1e6:.1f} MB/s (this store's past fetches)"
            if rate
            else "no fetch measured by this store yet, so fetches are not "
            "modelled (`ovspec cache pull` or --measure measures one)"
        )
