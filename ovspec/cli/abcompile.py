"""``ovspec ab-compile``: a counterbalanced A/B trial of compile time between two arms."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    KEY_VALUE,
    LADDER,
    cache_dir_option,
    chunk_option,
    emit_json,
    json_option,
)
from ovspec.errors import BadRequestError
from ovspec.extras import require_extra
from ovspec.ladder import Ladder

KV = tuple[tuple[str, str], ...]


def _arm_options(letter: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """The ``--a-*`` or ``--b-*`` options of one arm."""
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
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


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
    type=click.IntRange(min=2),
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
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the AB/BA start.")
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
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    help="Seconds one compile process may take.",
)
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
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
    a_label: str | None,
    a_python: str | None,
    a_pythonpath: tuple[str, ...],
    a_libs: tuple[str, ...],
    a_env: KV,
    a_config: KV,
    b_label: str | None,
    b_python: str | None,
    b_pythonpath: tuple[str, ...],
    b_libs: tuple[str, ...],
    b_env: KV,
    b_config: KV,
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
    from ovspec.ir.model_dir import resolve_model
    from ovspec.ir.specialize import Phase
    from ovspec.stats.orders import Arm
    from ovspec.store.digests import DigestMemo
    from ovspec.store.local import Store
    from ovspec.trials.arms import load_arms, make_arm
    from ovspec.trials.records import TrialPlan, model_digest, specializations_for
    from ovspec.trials.report import build_report, format_report, report_to_dict, write_plot
    from ovspec.trials.runner import RunEvent, run_trial

    per_arm: tuple[object, ...] = (a_label, a_python, a_pythonpath, a_libs, a_env, a_config)
    per_arm += (b_label, b_python, b_pythonpath, b_libs, b_env, b_config)
    if arms_file is not None:
        if any(per_arm):
            raise BadRequestError("give the arms either with --arms FILE or --a-*/--b-*, not both")
        arm_a, arm_b = load_arms(arms_file, config)
    else:
        arm_a = make_arm(
            Arm.A,
            label=a_label,
            python=a_python,
            pythonpath=a_pythonpath,
            libs=a_libs,
            env=a_env,
            properties=a_config,
            common_properties=config,
        )
        arm_b = make_arm(
            Arm.B,
            label=b_label,
            python=b_python,
            pythonpath=b_pythonpath,
            libs=b_libs,
            env=b_env,
            properties=b_config,
            common_properties=config,
        )

    root = cache_dir if cache_dir is not None else Store.default_root()
    # Built-in models are written under the cache folder; the store itself is not
    # opened: no compile of a trial may be a store hit.
    model_dir = resolve_model(model, root / "models")
    rungs.check_fits(model_dir.max_position_embeddings)
    memo = DigestMemo()
    plan = TrialPlan(
        model=model_dir,
        model_digest=model_digest(model_dir, memo),
        specializations=specializations_for(rungs, Phase(phase), chunk_tokens),
        device=device,
        arm_a=arm_a,
        arm_b=arm_b,
        pairs=pairs,
        seed=seed,
        timeout_s=timeout_s,
    )
    results = out if out is not None else Path(f"ab-compile-{plan.digest()}.jsonl")
    total = len(plan.schedule())
    click.echo(
        f"ab-compile: {total} compiles planned ({pairs} pairs + 1 warm-up x "
        f"{len(plan.specializations)} rungs x 2 arms); results in {results}",
        err=True,
    )

    def line(event: RunEvent) -> str:
        r = event.record
        warm = " warm-up" if r.warmup else ""
        return (
            f"[{event.done}/{event.total}] pair {r.pair}{warm} {r.spec_label} arm {r.arm.value}: "
            f"wall {r.wall_s:.3f} s, cpu {r.cpu_s:.3f} s, blob {r.blob_xxh3[:10]}"
        )

    if sys.stderr.isatty():
        with click.progressbar(length=total, label="compiling", file=sys.stderr) as bar:

            def advance(event: RunEvent) -> None:
                bar.label = line(event)
                bar.update(event.done - bar.pos)

            progress = run_trial(plan, results, max_runs=max_runs, on_run=advance)
    else:
        progress = run_trial(
            plan, results, max_runs=max_runs, on_run=lambda e: click.echo(line(e), err=True)
        )

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
