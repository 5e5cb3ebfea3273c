"""``ovspec plan``: where one-ahead compilation would stall on a ladder, and whether
starting a successor early removes it. Costs come from flags, the store's history
of this model's builds, or a short measured decode per rung: the workflow is
``runtime.planner``'s; this module parses the request and prints the report.
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
    check_device,
    checked_model,
    chunk_option,
    compress_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
    load_mode_option,
    open_store,
    remote_options,
    repeats_range,
    tokens_range,
)
from ovspec.errors import OvspecError
from ovspec.ir.compression import Compression
from ovspec.ladder import Ladder
from ovspec.runtime.costs import DEFAULT_MEASURE_STEPS
from ovspec.runtime.plan import RungValues
from ovspec.runtime.planner import DEFAULT_PROMPT_TOKENS

if TYPE_CHECKING:
    from ovspec.runtime.planner import PlanReport
    from ovspec.store.remote import RemoteConfig


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
    type=tokens_range(),
    default=DEFAULT_PROMPT_TOKENS,
    show_default=True,
    help="Prompt length: it picks the first rung and shortens its window.",
)
@click.option(
    "--new-tokens",
    type=tokens_range(0),
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
    type=repeats_range(),
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
@click.option(
    "--build-lanes",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Builds that run at once, for auto's schedule (the split's host: 1).",
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
    build_lanes: int,
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
    from ovspec.compile.modes import BlobMode
    from ovspec.runtime.autopolicy import Lanes
    from ovspec.runtime.planner import PlanRequest, make_plan
    from ovspec.runtime.schedule import EarlyStartRule
    from ovspec.store.local import Store

    if decode_values is not None and measure_flag:
        raise click.UsageError("--decode-ms and --measure both give the decode rate; choose one")
    request = PlanRequest(
        model=model,
        ladder=ladder,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        device=device,
        properties=dict(config),
        compression=compression,
        blob_mode=BlobMode(blob_mode),
        chunk_tokens=chunk_tokens,
        compile_s=compile_values,
        decode_ms=decode_values,
        measure=measure_flag,
        measure_steps=measure_steps,
        early_start=not no_early_start,
        rule=EarlyStartRule(rule.replace("-", "_")),
        load_mode=load_mode,
        lanes=Lanes(build_lanes, build_lanes),
    )
    if request.reads_store:
        # Every check before the store is opened (a built-in model is written into it).
        checked_model(model, ladder)
        check_device(device, dict(config))
        root = cache_dir if cache_dir is not None else Store.default_root()
        with open_store(root, remote) as store:
            report = make_plan(
                request, store, on_progress=lambda m: click.echo(f"ovspec plan: {m}", err=True)
            )
    else:
        report = make_plan(request)
    if as_json:
        emit_json(report.to_json())
        return
    _echo_text(report)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _echo_text(report: PlanReport) -> None:
    costs, shown, sources = report.costs, report.shown, report.sources
    device = report.request.device
    click.echo(f"model    {report.model}")
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
        f"foreground compile {shown.foreground_s:.3f} s ({report.prefill_note}; "
        f"decode@{first} {first_s:.3f} s; {how} side by side)"
    )
    speculative = ", ".join(str(c.capacity_tokens) for c in shown.speculative)
    click.echo(
        f"predicted boundary wait {shown.wait_s:.3f} s; last token at {shown.finished_s:.3f} s"
        + (f"; speculative compiles: {speculative}" if speculative else "")
    )
    click.echo(report.conclusion)
    click.echo("")
    _echo_auto(report)


def _echo_auto(report: PlanReport) -> None:
    """auto's schedule in one table (a row per rung it decodes on) and why."""
    decision = report.auto
    if decision is None:
        click.echo(f"auto: no schedule ({report.auto_note})")
        return
    schedule, chosen = decision.schedule, decision.chosen
    lanes = f", {schedule.lanes} builds at once" if schedule.lanes > 1 else ""
    click.echo(f"auto: {schedule.name} on rungs {','.join(map(str, schedule.rungs))}{lanes}")
    slack = {b.to_capacity_tokens: b for b in chosen.boundaries}
    rows = []
    for rung in schedule.rungs:
        start_s, ready_s = chosen.build_s[rung]
        start = schedule.starts.get(rung)
        b = slack.get(rung)
        rows.append(
            [
                str(rung),
                start.label() if start is not None else "first rung",
                f"{start_s:.3f}",
                f"{ready_s:.3f}",
                f"{b.boundary_s:.3f}" if b is not None else "-",
                f"{b.slack_s:+.3f}" if b is not None else "-",
            ]
        )
    header = ["rung", "build queued", "start s", "ready s", "needed s", "slack s"]
    for text in _table(header, rows, {0, 1}):
        click.echo(text)
    for reason in decision.reasons:
        click.echo(f"  - {reason}")
    fixed = ", ".join(f"{k} {v.finished_s:.3f} s" for k, v in decision.fixed.items())
    click.echo(f"predicted last token: auto {chosen.finished_s:.3f} s; {fixed}")
