"""The ``ovspec`` command line: one click group, one module per command family.

The CLI imports workflows, never the reverse. ``OvspecError`` becomes one line on
stderr and its exit code; any other exception reaching here is a bug.
"""

from __future__ import annotations

import sys

import click

from ovspec import __version__
from ovspec.errors import OvspecError


class OvspecGroup(click.Group):
    """Turns ``OvspecError`` into one line on stderr and the error's exit code."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except OvspecError as exc:
            click.echo(f"ovspec: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=OvspecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ovspec")
def cli() -> None:
    """Static capacity specializations and a blob store for LLM decode on OpenVINO."""


def _register() -> None:
    # Command modules import openvino lazily, inside their commands, so that
    # `ovspec --help` stays fast.
    from ovspec.cli import commands  # noqa: F401


def main() -> None:
    _register()
    try:
        cli.main(prog_name="ovspec")
    except OvspecError as exc:  # raised outside a command (e.g. in a callback)
        click.echo(f"ovspec: error: {exc}", err=True)
        sys.exit(exc.exit_code)
