"""Claims the README makes of every command: --help works and --json exists."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli


def leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += leaf_commands(command, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


COMMANDS = leaf_commands(cli)


def test_the_command_list_is_complete() -> None:
    names = {" ".join(c) for c in COMMANDS}
    assert {"build", "generate", "bench", "plan", "ab-compile", "cache ls", "patch apply"} <= names


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_has_help_and_json(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--json" in result.output
