"""What the benchmark scripts in tools/ share on their command line: the model they
measure (a folder or a built-in preset written once under a models folder) and the
timestamped progress lines they write to stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ovspec.bench.common.records import DEFAULT_MODELS_DIR

F = TypeVar("F", bound=Callable[..., Any])

MODELS_DIR_HELP = "Where built-in models are written and reused between runs."


def model_options(models_dir_help: str = MODELS_DIR_HELP) -> Callable[[F], F]:
    """``--model`` (as ``model_reference``) and ``--models-dir``, in that order."""

    def decorate(func: F) -> F:
        func = click.option(
            "--models-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=DEFAULT_MODELS_DIR,
            show_default=True,
            help=models_dir_help,
        )(func)
        return click.option(
            "--model",
            "model_reference",
            default="builtin:qwen2.5-0.5b",
            show_default=True,
            help="Model folder, or builtin:PRESET (written once under --models-dir).",
        )(func)

    return decorate


def progress_printer(started: float) -> Callable[[str], None]:
    """A function that writes a message to stderr behind the seconds since ``started``
    (a ``time.perf_counter()`` reading)."""

    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:7.1f} s] {message}", err=True)

    return say
