"""``ovspec patch``: list the shipped compiler patches; check, apply or revert one in a checkout.

A thin layer over ``ovspec.trials.patches``; its ``PatchError`` becomes one line on stderr
and exit 2. ``check`` exits 1 when the patch conflicts with the checkout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from ovspec.cli import cli
from ovspec.trials import patches as patching

_F = TypeVar("_F", bound=Callable[..., object])

# `check` answers "conflict" with this exit code (2 is taken by "cannot check").
EXIT_CONFLICT = 1


def _patch_option(f: _F) -> _F:
    option = click.option(
        "--patch",
        "patch_name",
        metavar="NAME|FILE",
        default=None,
        help="A shipped patch by name (see `ovspec patch list`) or a .diff file."
        " [default: the first shipped patch]",
    )
    return option(f)


def _json_option(f: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def _source_dir_argument(f: _F) -> _F:
    # No exists=True: ovspec.trials.patches says what is wrong with the folder and what to do.
    argument = click.argument("source_dir", type=click.Path(file_okay=True, path_type=Path))
    return argument(f)


def _echo_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


@cli.group()
def patch() -> None:
    """Compiler source patches shipped with ovspec (e.g. for openvinotoolkit/npu_compiler).

    SOURCE_DIR is the top of a git checkout of the patch's base repository. Patches
    change the work tree only (never the index or a commit) and refuse uncommitted
    changes of their own files that they did not make.
    """


@patch.command("list")
@_json_option
def list_patches(as_json: bool) -> None:
    """List the shipped patches: name, id, base repository@commit and files."""
    patches = patching.available_patches()
    if as_json:
        _echo_json([p.to_json() for p in patches])
        return
    if not patches:
        click.echo("no patches installed")
        return
    for p in patches:
        click.echo(p.describe())


@patch.command("check")
@_source_dir_argument
@_patch_option
@_json_option
@click.pass_context
def check_patch(
    ctx: click.Context, source_dir: Path, patch_name: str | None, as_json: bool
) -> None:
    """Say whether the patch is applicable, applied, in HEAD or in conflict in SOURCE_DIR.

    Exit status: 0 applicable, applied or in HEAD; 1 conflict; 2 SOURCE_DIR cannot be
    checked (not a git checkout, wrong repository or commit, foreign uncommitted changes).
    """
    report = patching.check(patching.resolve_patch(patch_name), source_dir)
    if as_json:
        _echo_json(report.to_json())
    else:
        click.echo(report.describe())
    if report.state is patching.PatchState.CONFLICT:
        ctx.exit(EXIT_CONFLICT)


def _change(
    change: Callable[[patching.Patch, Path], patching.PatchCheck],
    source_dir: Path,
    patch_name: str | None,
    verbs: tuple[str, str],
    as_json: bool,
) -> None:
    """Apply ``change`` to SOURCE_DIR and report it against the state before. ``verbs``:
    what to say when the work tree changed, and when it was already so."""
    chosen = patching.resolve_patch(patch_name)
    before = patching.check(chosen, source_dir)
    after = change(chosen, source_dir)
    changed = before.state is not after.state
    if as_json:
        _echo_json({"changed": changed, "before": before.state.value, **after.to_json()})
    else:
        click.echo(f"{verbs[0] if changed else verbs[1]}: {after.describe()}")


@patch.command("apply")
@_source_dir_argument
@_patch_option
@_json_option
def apply_patch(source_dir: Path, patch_name: str | None, as_json: bool) -> None:
    """Apply the patch to the work tree of SOURCE_DIR (a no-op when already applied)."""
    _change(patching.apply, source_dir, patch_name, ("applied", "already applied"), as_json)


@patch.command("revert")
@_source_dir_argument
@_patch_option
@_json_option
def revert_patch(source_dir: Path, patch_name: str | None, as_json: bool) -> None:
    """Undo an uncommitted apply in SOURCE_DIR (a no-op when the patch is not applied)."""
    _change(patching.revert, source_dir, patch_name, ("reverted", "not applied"), as_json)
