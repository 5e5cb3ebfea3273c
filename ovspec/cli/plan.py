"""``ovspec plan``: where one-ahead compilation would stall on a ladder, and whether
starting a successor early removes it. Costs come from flags, the store's history
of this model's builds, or a short measured decode per rung.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ovspec.cli import cli, error_text
from ovspec.cli.options import (
    blob_mode_option,
    cache_dir_option,
    chunk_option,
    compress_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
    load_mode_option,
    open_store,
    remote_options,
)
from ovspec.errors import OvspecError
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder
from ovspec.runtime.costs import DEFAULT_MEASURE_STEPS
from ovspec.runtime.plan import Plan, RungCosts, RungValues

if TYPE_CHECKING:
    from ovspec.store.remote import RemoteConfig

DEFAULT_PROMPT_TOKENS = 128
DEFAULT_CHUNK_TOKENS = 128


class RungValuesType(click.ParamType[RungValues, Any]):
    """``1024=0.8,2048=1.0``, ``0.8``, or ``0.8,8192=2.5``."""

    name = "RUNG=VALUE,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, RungValues):
            return value
        flag = param.opts[0] if param is not None and param.opts else "value"
        try:
            return RungValues.parse(str(value), flag)
        except OvspecError as exc:
            self.fail(error_text(exc), param, ctx)


RUNG_VALUES = RungValuesType()


@cli.command()
@click.argument("model")
@ladder_option
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_PROMPT_TOKENS,
    show_default=True,
    help="Prompt length: it picks the first rung and shortens its window.",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Decode steps after the prompt.  [default: up to the top rung]",
)
@device_options
@compress_option
@blob_mode_option
@chunk_option
@click.option(
    "--compile-s",
    "compile_values",
    type=RUNG_VALUES,
    default=None,
    help="Seconds to have each rung's decode program ready (build + import), per rung "
    "(1024=0.8,2048=1.0) or one value.  [default: the store's history]",
)
@click.option(
    "--decode-ms",
    "decode_values",
    type=RUNG_VALUES,
    default=None,
    help="Milliseconds per decode step, per rung (1024=3.1,2048=3.4) or one value.  "
    "[default: --measure]",
)
@click.option(
    "--measure",
    "measure_flag",
    is_flag=True,
    help="Measure: make each rung ready through the store (compiling what is missing), "
    "time a short decode on it, and the prompt's prefill. The default when --decode-ms "
    "is not given.",
)
@click.option(
    "--measure-steps",
    type=click.IntRange(min=1),
    default=DEFAULT_MEASURE_STEPS,
    show_default=True,
    help="Decode steps timed per rung with --measure (the median counts).",
)
@click.option(
    "--no-early-start",
    is_flag=True,
    help="Plan pure one-ahead: never queue a rung before its predecessor is entered.",
)
@click.option(
    "--rule",
    type=click.Choice(["window", "latest-start"]),
    default="latest-start",
    show_default=True,
    help="Early-start rule (the loader's default is latest-start): latest-start queues a "
    "rung when its latest feasible start comes before the next boundary; window queues "
    "a rung when the window before it is shorter than its compile.",
)
@load_mode_option
@cache_dir_option
@remote_options
@json_option
def plan(
    model: str,
    ladder: Ladder,
    prompt_tokens: int,
    new_tokens: int | None,
    device: str,
    config: tuple[tuple[str, str], ...],
    compression: Compression,
    blob_mode: str,
    chunk_tokens: int,
    compile_values: RungValues | None,
    decode_values: RungValues | None,
    measure_flag: bool,
    measure_steps: int,
    no_early_start: bool,
    rule: str,
    load_mode: str | None,
    cache_dir: Path | None,
    remote: RemoteConfig | None,
    as_json: bool,
) -> None:
    """Predict, per boundary, T_compile(next rung) against T_decode(window) for a
    request on MODEL (folder or builtin:PRESET), and where one-ahead would stall.

    A boundary is stall-free when the next rung's program is ready before decode
    reaches it. MODEL is read only when a cost comes from the store or --measure. With
    --remote, a rung the remote holds costs its fetch (bytes / the fetch bandwidth the
    store measured) instead of its compile: the loader prefers a fetch.
    """
    from ovspec.runtime.costs import history, measure
    from ovspec.runtime.plan import conclusion, plan_one_ahead, rungs_needed
    from ovspec.runtime.schedule import EarlyStartRule

    if decode_values is not None and measure_flag:
        raise click.UsageError("--decode-ms and --measure both give the decode rate; choose one")
    # With no decode rate given, measure it: a plan needs one, and the store's history
    # records compiles, not decode steps.
    measure_flag = measure_flag or decode_values is None
    new = max(ladder.top_tokens - prompt_tokens, 0) if new_tokens is None else new_tokens
    rungs = rungs_needed(ladder, prompt_tokens, new)
    compile_s = (
        compile_values.resolve(rungs, ladder, "--compile-s") if compile_values is not None else None
    )
    decode_s = (
        {r: ms / 1000 for r, ms in decode_values.resolve(rungs, ladder, "--decode-ms").items()}
        if decode_values is not None
        else None
    )

    sources: dict[str, str] = {}
    details: dict[int, dict[str, object]] = {r: {} for r in ladder}
    prefill_compile_s = 0.0
    prefill_s = 0.0
    prefill_note = "prefill graph: not in --compile-s, counted 0"
    fetch_s: dict[int, float] = {}
    model_root: str | None = None
    if compile_s is not None:
        sources["compile"] = "--compile-s"
    if decode_s is not None:
        sources["decode"] = "--decode-ms"
    if measure_flag or compile_s is None:
        from ovspec.compile.compiler import Compiler
        from ovspec.compile.modes import BlobMode
        from ovspec.ir.model_dir import resolve_model
        from ovspec.store.local import Store

        root = cache_dir if cache_dir is not None else Store.default_root()
        store = open_store(root, remote)
        try:
            model_dir = resolve_model(model, store.models_folder)
            model_root = str(model_dir.root)
            ladder.check_fits(model_dir.max_position_embeddings)
            if measure_flag:
                from ovspec.runtime.decoding import open as open_loader
                from ovspec.runtime.loader import Policy

                with open_loader(
                    model,
                    ladder,
                    device=device,
                    properties=dict(config),
                    store=store,
                    policy=Policy.ON_DEMAND,
                    prefill_chunk_tokens=chunk_tokens,
                    compression=compression,
                    blob_mode=BlobMode(blob_mode),
                    load_mode=load_mode,
                ) as loader:
                    measured = measure(
                        loader,
                        rungs,
                        prompt_tokens,
                        measure_steps,
                        on_progress=lambda m: click.echo(f"ovspec plan: {m}", err=True),
                    )
                for m in measured.rungs:
                    details[m.capacity_tokens]["measured"] = {
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
                prefill_s = measured.prefill_s
                decode_s = {m.capacity_tokens: m.decode_s_per_token for m in measured.rungs}
                sources["decode"] = (
                    f"measured: median of {measure_steps} decode steps per rung; "
                    f"prefill of {prompt_tokens} tokens {prefill_s:.3f} s"
                )
                if compile_s is None:
                    costs_measured = measured.costs()
                    compile_s = dict(costs_measured.compile_s)
                    fetch_s = dict(costs_measured.fetch_s)
                    prefill_compile_s = measured.prefill_compile_s
                    prefill_note = f"{measured.prefill_label} {prefill_compile_s:.3f} s measured"
                    sources["compile"] = (
                        "measured: store build (compile + export; the recorded ones on a "
                        "hit) + import just now"
                    )
            else:
                compiler = Compiler(
                    model_dir,
                    device,
                    dict(config),
                    store,
                    compression=compression,
                    blob_mode=BlobMode(blob_mode),
                )
                try:
                    recorded = history(compiler, ladder, rungs, chunk_tokens)
                finally:
                    compiler.close()
                compile_s = recorded.compile_s()
                fetch_s = recorded.fetch_s()
                for r, record in recorded.decode.items():
                    details[r]["history"] = {
                        "key": record.key_hex,
                        "compile_s": record.compile_s,
                        "export_s": record.export_s,
                        "blob_bytes": record.blob_bytes,
                        "on_remote": record.on_remote,
                    }
                prefill_ready = recorded.prefill_ready_s()
                if recorded.prefill is not None and prefill_ready is not None:
                    prefill_compile_s = prefill_ready
                    prefill_note = f"{recorded.prefill.label} {prefill_compile_s:.3f} s"
                else:
                    prefill_note = "prefill graph: not in the history, counted 0"
                sources["compile"] = (
                    "store history: recorded compile + export (import not measured; "
                    "--measure adds it)"
                )
                if store.tier is not None:
                    on_remote = [r for r, rec in recorded.decode.items() if rec.on_remote]
                    rate = recorded.fetch_bytes_per_s
                    sources["fetch"] = f"{len(on_remote)} rungs on {store.tier.location}; " + (
                        f"fetch = bytes / {rate / 1e6:.1f} MB/s (this store's past fetches)"
                        if rate
                        else "no fetch measured by this store yet, so fetches are not "
                        "modelled (`ovspec cache pull` or --measure measures one)"
                    )
        finally:
            store.close()
    assert compile_s is not None and decode_s is not None
    costs = RungCosts(compile_s, decode_s, prefill_compile_s, prefill_s, fetch_s)
    chosen = EarlyStartRule(rule.replace("-", "_"))
    one_ahead = plan_one_ahead(ladder, prompt_tokens, new, costs, early_start=False)
    planned: Plan | None = None
    better: Plan | None = None
    if not no_early_start:
        planned = plan_one_ahead(ladder, prompt_tokens, new, costs, True, chosen)
        other = (
            EarlyStartRule.LATEST_START
            if chosen is EarlyStartRule.WINDOW
            else EarlyStartRule.WINDOW
        )
        better = plan_one_ahead(ladder, prompt_tokens, new, costs, True, other)
    line = conclusion(one_ahead, planned, better)
    shown = planned if planned is not None else one_ahead

    if as_json:
        emit_json(
            {
                "model": model_root or model,
                "device": device,
                "ladder": list(ladder),
                "prompt_tokens": prompt_tokens,
                "new_tokens": new,
                "sources": sources,
                "prefill_compile_s": prefill_compile_s,
                "prefill_s": prefill_s,
                "rungs": [
                    {
                        "capacity_tokens": r,
                        "compile_s": costs.compile_s.get(r),
                        "fetch_s": costs.fetch_s.get(r),
                        "decode_s_per_token": costs.decode_s_per_token.get(r),
                        "window_s": shown.window_s.get(r),
                        **details[r],
                    }
                    for r in ladder
                    if r in costs.compile_s or r in costs.decode_s_per_token
                ],
                "plan": shown.to_json(),
                "one_ahead": one_ahead.to_json(),
                "conclusion": line,
            }
        )
        return
    _echo_text(model_root or model, device, sources, costs, shown, prefill_note, line)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _echo_text(
    model: str,
    device: str,
    sources: dict[str, str],
    costs: RungCosts,
    shown: Plan,
    prefill_note: str,
    line: str,
) -> None:
    click.echo(f"model    {model}")
    click.echo(
        f"request  {shown.prompt_tokens} prompt + {shown.new_tokens} new tokens on ladder "
        f"{shown.ladder}, device {device}"
    )
    click.echo(f"compile  {sources['compile']}")
    if "fetch" in sources:
        click.echo(f"fetch    {sources['fetch']}")
    click.echo(f"decode   {sources['decode']}")
    early = f"on ({shown.rule.value.replace('_', '-')} rule)" if shown.early_start else "off"
    click.echo(f"early start {early}")
    click.echo("")
    fetches = bool(costs.fetch_s)  # the column shows only with a remote that has rungs
    rung_rows = [
        [
            str(r),
            f"{costs.compile_s[r]:.3f}" if r in costs.compile_s else "-",
            *([f"{costs.fetch_s[r]:.3f}" if r in costs.fetch_s else "-"] if fetches else []),
            f"{costs.decode_s_per_token[r] * 1000:.3f}" if r in costs.decode_s_per_token else "-",
            f"{shown.window_s[r]:.3f}" if r in shown.window_s else "-",
        ]
        for r in shown.ladder
        if r >= shown.first_capacity_tokens
    ]
    header = ["rung", "compile s", *(["fetch s"] if fetches else []), "decode ms/token", "window s"]
    for text in _table(header, rung_rows, {0}):
        click.echo(text)
    click.echo("")
    rows = [
        [
            b.label,
            str(b.window_tokens),
            f"{b.window_s:.3f}",
            f"{b.compile_s:.3f}" + (" (fetch)" if b.fetched else ""),
            f"{b.start_s:.3f}",
            f"{b.ready_s:.3f}",
            f"{b.boundary_s:.3f}",
            f"{b.slack_s:+.3f}",
            b.verdict,
        ]
        for b in shown.boundaries
    ]
    header = [
        "boundary",
        "window tok",
        "T_decode s",
        "T_compile s",
        "start s",
        "ready s",
        "boundary s",
        "slack s",
        "verdict",
    ]
    for text in _table(header, rows, {0, 8}):
        click.echo(text)
    first = shown.first_capacity_tokens
    click.echo("")
    first_s = costs.ready_s()[first]
    how = "fetched" if first in costs.fetch_s else "built"
    click.echo(
        f"foreground compile {shown.foreground_s:.3f} s ({prefill_note}; "
        f"decode@{first} {first_s:.3f} s; {how} side by side)"
    )
    speculative = ", ".join(str(c.capacity_tokens) for c in shown.speculative)
    click.echo(
        f"predicted boundary wait {shown.wait_s:.3f} s; last token at {shown.finished_s:.3f} s"
        + (f"; speculative compiles: {speculative}" if speculative else "")
    )
    click.echo(line)
