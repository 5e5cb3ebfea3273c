"""``ovspec ab-compile``: a counterbalanced A/B trial of compile time between two arms."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    KEY_VALUE,
    LADDER,
    MAX_TIMEOUT_S,
    SEED,
    FiniteFloatRange,
    cache_dir_option,
    checked_model,
    chunk_option,
    emit_json,
    json_option,
    model_folder,
    repeats_range,
)
from ovspec.errors import BadRequestError
from ovspec.extras import require_extra
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.stats.orders import Arm
    from ovspec.trials.arms import ArmSpec
    from ovspec.trials.records import TrialPlan
    from ovspec.trials.runner import TrialProgress

KV = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _ArmFlags:
    """What the ``--a-*`` or ``--b-*`` options of one arm said."""

    label: str | None
    python: str | None
    pythonpath: tuple[str, ...]
    libs: tuple[str, ...]
    env: KV
    config: KV

    def given(self) -> bool:
        return any(dataclasses.astuple(self))


_ARM_FIELDS = ("label", "python", "pythonpath", "libs", "env", "config")


def _arm_options(letter: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """The ``--a-*`` or ``--b-*`` options of one arm, handed to the command as one
    ``{letter}_arm`` (``_ArmFlags``)."""
    up = letter.upper()

    def decorate(func: Callable[..., object]) -> Callable[..., object]:
        options = [
            click.option(f"--{letter}-label", help=f"Name of arm {up} in the report."),
            click.option(
                f"--{letter}-python",
                metavar="PATH",
                help=f"Interpreter of arm {up} (a venv's bin/python; default: this one).",
            ),
            click.option(
                f"--{letter}-pythonpath",
                metavar="DIR",
                multiple=True,
                help=f"Folder put first on arm {up}'s PYTHONPATH (an openvino build), repeatable.",
            ),
            click.option(
                f"--{letter}-libs",
                metavar="DIR",
                multiple=True,
                help=f"Folder put first on arm {up}'s LD_LIBRARY_PATH, repeatable.",
            ),
            click.option(
                f"--{letter}-env",
                type=KEY_VALUE,
                multiple=True,
                help=f"Environment variable of arm {up}'s processes, repeatable.",
            ),
            click.option(
                f"--{letter}-config",
                type=KEY_VALUE,
                multiple=True,
                help=f"Compile property of arm {up} only (overrides --config), repeatable.",
            ),
        ]

        @functools.wraps(func)
        def collect(*args: Any, **kwargs: Any) -> object:
            flags = {name: kwargs.pop(f"{letter}_{name}") for name in _ARM_FIELDS}
            kwargs[f"{letter}_arm"] = _ArmFlags(**flags)
            return func(*args, **kwargs)

        command: Callable[..., object] = collect
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _arms(
    arms_file: Path | None, config: KV, a: _ArmFlags, b: _ArmFlags
) -> tuple[ArmSpec, ArmSpec]:
    """Arms A and B from --arms FILE, or from the --a-*/--b-* options."""
    from ovspec.stats.orders import Arm
    from ovspec.trials.arms import load_arms, make_arm

    if arms_file is not None:
        if a.given() or b.given():
            raise BadRequestError("give the arms either with --arms FILE or --a-*/--b-*, not both")
        return load_arms(arms_file, config)

    def arm(which: Arm, flags: _ArmFlags) -> ArmSpec:
        return make_arm(
            which,
            label=flags.label,
            python=flags.python,
            pythonpath=flags.pythonpath,
            libs=flags.libs,
            env=flags.env,
            properties=flags.config,
            common_properties=config,
        )

    return arm(Arm.A, a), arm(Arm.B, b)


def plot_needs_the_bench_extra(
    ctx: click.Context, param: click.Parameter, value: Path | None
) -> Path | None:
    """--plot draws with matplotlib: refuse it before the trial runs, not after."""
    if value is not None:
        require_extra("bench", "ab-compile --plot")
    return value


@cli.command("ab-compile")
@click.argument("model")
@click.option(
    "--pairs",
    type=repeats_range(2),
    default=5,
    show_default=True,
    help="Measured A/B pairs (one more warm-up pair is run and left out).",
)
@click.option(
    "--rungs",
    type=LADDER,
    default="1024,2048",
    show_default=True,
    help="KV capacities to compile, one specialization each (K = x1024).",
)
@click.option(
    "--phase",
    type=click.Choice(["decode", "prefill"]),
    default="decode",
    show_default=True,
    help="Which graph of each rung to compile.",
)
@chunk_option
@click.option("--device", default="CPU", show_default=True, help="OpenVINO device.")
@click.option(
    "--config",
    type=KEY_VALUE,
    multiple=True,
    help="Compile property of both arms, repeatable (CACHE_DIR is refused).",
)
@click.option(
    "--arms",
    "arms_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML file with [a] and [b] tables (label, python, pythonpath, libs, env, config).",
)
@_arm_options("a")
@_arm_options("b")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds the AB/BA start.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results file (JSON lines; resumed if it exists) [default: ./ab-compile-<trial>.jsonl].",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=plot_needs_the_bench_extra,
    help="Write a PNG paired plot (one line per pair, A to B) here.",
)
@click.option(
    "--run-timeout",
    "timeout_s",
    type=FiniteFloatRange(0, MAX_TIMEOUT_S, min_open=True),
    default=3600.0,
    show_default=True,
    help="Seconds one compile process may take.",
)
@click.option(
    "--max-runs",
    type=repeats_range(),
    help="Stop after this many new compiles; the same command continues the trial.",
)
@cache_dir_option
@json_option
def ab_compile(
    model: str,
    pairs: int,
    rungs: Ladder,
    phase: str,
    chunk_tokens: int,
    device: str,
    config: KV,
    arms_file: Path | None,
    a_arm: _ArmFlags,
    b_arm: _ArmFlags,
    seed: int,
    out: Path | None,
    plot: Path | None,
    timeout_s: float,
    max_runs: int | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Time MODEL's compiles under arm A and arm B in counterbalanced pairs.

    MODEL is a model folder or builtin:PRESET. Each compile runs in a fresh process of
    its arm with CACHE_DIR off and the store bypassed; each run records the libraries
    that loaded (with hashes), and runs whose environment differs from their arm's
    other runs are refused. Results are appended to --out as they land: rerun the same
    command to continue an interrupted trial or to print its report again.

    \b
    Arms differ by interpreter (--a-python/--b-python: a venv with another openvino),
    Python or library folders, environment variables, or compile properties:
      ovspec ab-compile builtin:small --rungs 128,256 --pairs 5 \\
          --b-config SNIPPETS_MODE=DISABLE
      ovspec ab-compile MODEL --a-python /opt/ov-stock/bin/python \\
          --b-python /opt/ov-patched/bin/python --device NPU --config NPU_PLATFORM=4000
    """
    from ovspec.ir.specialize import Phase
    from ovspec.trials.records import TrialPlan

    arms = _arms(arms_file, config, a_arm, b_arm)
    # A built-in model is written into the store's models folder (the store is opened
    # for that only): no compile of a trial may be a store hit.
    checked_model(model, rungs)  # before a built-in model is written into the store
    model_dir = model_folder(model, cache_dir)
    plan = TrialPlan.for_rungs(
        model_dir, rungs, Phase(phase), chunk_tokens, device, arms, pairs, seed, timeout_s
    )
    results = out if out is not None else Path(f"ab-compile-{plan.digest()}.jsonl")
    total = len(plan.schedule())
    click.echo(
        f"ab-compile: {total} compiles planned ({pairs} pairs + 1 warm-up x "
        f"{len(plan.specializations)} rungs x 2 arms); results in {results}",
        err=True,
    )
    progress = _run_with_progress(plan, results, max_runs, total)
    if not progress.complete:
        click.echo(
            f"ab-compile: stopped after {progress.ran} compiles; {progress.done}/"
            f"{progress.total} recorded in {results}; run the same command to continue",
            err=True,
        )
        if as_json:
            emit_json(
                {
                    "complete": False,
                    "results": str(results),
                    "done": progress.done,
                    "total": progress.total,
                }
            )
        return
    from ovspec.trials.report import build_report, format_report, report_to_dict, write_plot

    report = build_report(plan, progress.records, results)
    if plot is not None:
        write_plot(report, plot)
    if as_json:
        emit_json({"complete": True, **report_to_dict(report), "plot": str(plot) if plot else None})
        return
    for text in format_report(report):
        click.echo(text)
    if plot is not None:
        click.echo(f"plot: {plot}")


def _run_with_progress(
    plan: TrialPlan, results: Path, max_runs: int | None, total: int
) -> TrialProgress:
    """Run the trial, showing each compile as it lands (a bar on a terminal)."""
    from ovspec.trials.runner import RunEvent, run_trial

    def line(event: RunEvent) -> str:
        r = event.record
        warm = " warm-up" if r.warmup else ""
        return (
            f"[{event.done}/{event.total}] pair {r.pair}{warm} {r.spec_label} arm {r.arm.value}: "
            f"wall {r.wall_s:.3f} s, cpu {r.cpu_s:.3f} s, blob {r.blob_xxh3[:10]}"
        )

    if not sys.stderr.isatty():
        return run_trial(
            plan, results, max_runs=max_runs, on_run=lambda e: click.echo(line(e), err=True)
        )
    with click.progressbar(length=total, label="compiling", file=sys.stderr) as bar:

        def advance(event: RunEvent) -> None:
            bar.label = line(event)
            bar.update(event.done - bar.pos)

        return run_trial(plan, results, max_runs=max_runs, on_run=advance)
