"""Running ``ovspec`` in-process for the CLI tests: one command and its result, a
``generate --json`` document, and the exact-f32 CPU properties as ``--config`` flags."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

EXACT = [arg for k, v in EXACT_CPU_PROPERTIES.items() for arg in ("--config", f"{k}={v}")]


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def generate_json(*args: str) -> dict[str, object]:
    """``ovspec generate ARGS --json``'s document; the command must succeed."""
    result = run("generate", *args, "--json")
    assert result.exit_code == 0, result.output
    document: dict[str, object] = json.loads(result.stdout)
    return document
