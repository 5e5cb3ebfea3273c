"""The ``ovspec`` command line: one click group, one module per command family.

The CLI imports workflows, never the reverse. Every error a user can cause ends as
one line on stderr and a non-zero exit: ``OvspecError`` with its own exit code,
click's usage errors with 2. Any other exception reaching here is a bug.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import click

from ovspec.errors import OvspecError
from ovspec.version import __version__

# Library arguments whose command-line option is not their kebab-case name.
CLI_OPTIONS: dict[str, str] = {
    "properties": "--config",
    "root": "--cache-dir",
    "store": "--cache-dir",
    "prefill_chunk_tokens": "--chunk",
    "chunk_tokens": "--chunk",
    "forced_ids": "--ids",
    "prompt_ids": "--ids",
    "steps": "--measure-steps",
    "decode_s_per_token": "--decode-ms",
    "timeout_s": "--run-timeout",
    "pythonpath": "--a-pythonpath/--b-pythonpath",
    "libs": "--a-libs/--b-libs",
    "trust_shared": "--trust-shared-store",
}


def error_text(exc: OvspecError) -> str:
    """An ovspec error as a command-line user reads it (options, not Python arguments)."""
    return exc.cli_message(CLI_OPTIONS)


@contextlib.contextmanager
def tool_errors(prefix: str) -> Iterator[None]:
    """For the scripts in tools/: an ovspec error raised inside ends as one line,
    ``PREFIX: message``, on stderr and the error's exit code."""
    try:
        yield
    except OvspecError as exc:
        click.echo(f"{prefix}: {error_text(exc)}", err=True)
        sys.exit(exc.exit_code)


def _fail(message: str, exit_code: int) -> NoReturn:
    click.echo(f"ovspec: error: {message}", err=True)
    sys.exit(exit_code)


class OvspecGroup(click.Group):
    """Formats every failure as one line and exits with its code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "ovspec"
            _fail(f"{exc.format_message()} (see '{where} --help')", exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("aborted", 1)
        except OvspecError as exc:
            _fail(error_text(exc), exc.exit_code)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OvspecError as exc:
            _fail(error_text(exc), exc.exit_code)


@click.group(cls=OvspecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ovspec")
def cli() -> None:
    """Static capacity specializations and a blob store for LLM decode on OpenVINO."""


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning is one line on stderr, like an error (not file:line plus source)."""
    click.echo(f"ovspec: warning: {message}", err=True)


def main() -> None:
    # Command modules import openvino lazily, inside their commands, so that
    # `ovspec --help` stays fast.
    from ovspec.cli import commands  # noqa: F401

    warnings.showwarning = _show_warning
    try:
        cli.main(prog_name="ovspec")
    except SystemExit as done:
        _exit_past_abandoned_builds(done)
        raise


def _exit_past_abandoned_builds(done: SystemExit) -> None:
    """Exit now, without joining a loader's worker still finishing a build nobody will use
    (``Loader.close(wait_for_builds=False)``): an OpenVINO compile cannot be stopped, and
    the interpreter would wait for it. Its store writes are crash-safe (temp, rename)."""
    if "ovspec.runtime.worker" not in sys.modules:
        return  # no loader was made: no worker (and no reason to import OpenVINO here)
    from ovspec.runtime.worker import builds_left_running

    if builds_left_running():
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
