"""``ovspec profile``: where one decode step of a rung goes, next to genai's two CPU
backends on the same IR (the stateful model, and the PagedAttention graph, its default)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    cache_dir_option,
    check_device,
    checked_model,
    chunk_option,
    device_options,
    emit_json,
    json_option,
    model_folder,
    repeats_range,
    tokens_range,
)
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.bench.profile.rung import CompileOrder

TOP_TYPES = 12


@cli.command()
@click.argument("model")
@click.option(
    "--rung",
    "capacity_tokens",
    type=tokens_range(),
    required=True,
    help="The rung (KV capacity) whose decode step is profiled.",
)
@click.option(
    "--live",
    "live_tokens",
    type=tokens_range(0),
    default=None,
    help="Live KV tokens during the step.  [default: the rung - 1]",
)
@click.option(
    "--steps",
    type=repeats_range(),
    default=8,
    show_default=True,
    help="Decode steps timed per graph (medians count).",
)
@click.option(
    "--rewrites",
    default=None,
    help="Graph rewrites, '+'-joined (split-attention, last-position-logits, "
    "live-tokens-state, merged-presents) or none.  [default: the device's]",
)
@click.option(
    "--graph",
    "graph",
    type=click.Choice(["later", "prompt"]),
    default="later",
    show_default=True,
    help="The graph stepped: 'later', the static decode graph every rung after the "
    "prompt's decodes on; 'prompt', the 1..P graph the prompt's rung decodes on (CPU).",
)
@click.option(
    "--compile-order",
    type=click.Choice(["both", "rung-first", "stateful-first"]),
    default="both",
    show_default=True,
    help="Which graph compiles first. Of two graphs compiled in one process the earlier "
    "can step slower (4-6% on some machines): 'both' profiles each order and combines them.",
)
@chunk_option
@device_options
@cache_dir_option
@json_option
def profile(
    model: str,
    capacity_tokens: int,
    live_tokens: int | None,
    steps: int,
    rewrites: str | None,
    graph: str,
    compile_order: CompileOrder,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Per-op-type time of one decode step of MODEL's rung next to genai's two CPU
    backends at the same live length, the stateful model (SDPA) and the PagedAttention
    graph (its default), from OpenVINO's PERF_COUNT, and the floors: both peers' steps
    and a weights-only read of the .bin."""
    from ovspec.bench.profile.rung import profile_rung
    from ovspec.compile.devices import profile_for
    from ovspec.ir.rewrites import RewriteSet

    rewrite_set = RewriteSet.parse(rewrites) if rewrites is not None else None
    checked_model(model, Ladder((capacity_tokens,)))
    check_device(device, dict(config))
    model_dir = model_folder(model, cache_dir)
    profile = profile_for(device, dict(config))
    properties = profile.loader_properties(dict(config) if config else profile.exact_properties)
    report = profile_rung(
        model_dir,
        capacity_tokens,
        live_tokens,
        device=device,
        properties=properties,
        rewrites=rewrite_set,
        steps=steps,
        chunk_tokens=chunk_tokens,
        prompt_rung=graph == "prompt",
        compile_order=compile_order,
    )
    if as_json:
        emit_json(report.to_json())
        return
    stateful = report.stateful
    orders = "both compile orders" if compile_order == "both" else compile_order
    click.echo(
        f"decode@{report.capacity_tokens} ({report.graph}) with {report.live_tokens} live "
        f"tokens on {report.device}, rewrites {report.rewrites}; medians of {report.steps} "
        f"steps, {orders}"
    )
    # genai's default CPU backend is PagedAttention: where it runs, it is the peer.
    columns = [("rung", report.rung), ("stateful", stateful), ("paged", report.paged)]
    shown = [(label, step) for label, step in columns if step is not None]
    click.echo(f"{'op type':<28}" + "".join(f"{label + ' ms':>14}" for label, _ in shown))
    types: list[str] = []
    for _, step in shown:
        types += [t for t in list(step.by_type_ms)[:TOP_TYPES] if t not in types]
    for name in types:
        click.echo(f"{name:<28}" + "".join(f"{_ms(s.by_type_ms.get(name)):>14}" for _, s in shown))
    click.echo(f"{'sum of op types':<28}" + "".join(f"{_ms(s.summed_ms):>14}" for _, s in shown))
    click.echo(f"{'step (wall)':<28}" + "".join(f"{_ms(s.step_ms):>14}" for _, s in shown))
    for label, step in shown:
        if step.summed_ms > 1.5 * step.step_ms:
            times = step.summed_ms / step.step_ms
            click.echo(
                f"note: the {label} graph's op-type times add up to {times:.1f}x its step "
                "(op types overlap in time): compare walls"
            )
    if report.order_ratios:
        ratios = ", ".join(f"{name} {r:.3f}" for name, r in report.order_ratios.items())
        click.echo(f"rung / stateful step by compile order: {ratios}")
    click.echo(
        "peers: stateful = genai's LLMPipeline with ATTENTION_BACKEND=SDPA; paged = its "
        "default backend (PA), the graph `--load-mode paged` runs"
        + ("" if report.paged is not None else " (not run: the device has no PagedAttention)")
    )
    click.echo(
        f"floor: paged step {_ms(report.paged.step_ms if report.paged else None)} ms, "
        f"stateful step {_ms(stateful.step_ms if stateful else None)} ms; weights-only "
        f"read {report.weights_read_ms:.1f} ms ({report.weights_bytes / 2**20:.0f} MiB, every "
        f"thread); live KV {report.kv_bytes / 2**20:.1f} MiB"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
