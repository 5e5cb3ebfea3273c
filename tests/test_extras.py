"""Without the bench extra (matplotlib, psutil), as after a plain ``pip install ovspec``:
every command's help and README command 1 work, and what needs the extra says so in one
line (exit 2). The modules are blocked by a meta-path finder in a fresh interpreter."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ovspec.errors import MissingExtraError
from ovspec.extras import EXTRAS, require_extra

TOOLS = Path(__file__).resolve().parents[1] / "tools"
INSTALL = "pip install 'ovspec[bench]'"

# Runs argv[1:] as the ovspec command line, or argv[2] as a script with "--script",
# with the bench extra's modules refusing to import.
BLOCKED = textwrap.dedent(
    """
    import os, runpy, sys
    BLOCKED = {"matplotlib", "psutil"}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    if sys.argv[1] == "--script":
        sys.argv = sys.argv[2:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as python SCRIPT
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        from ovspec.cli import main
        sys.argv = ["ovspec", *sys.argv[1:]]
        main()
    """
)

EVERY_HELP = textwrap.dedent(
    """
    import click
    from click.testing import CliRunner
    import ovspec.cli.commands
    from ovspec.cli import cli

    def leaves(group, prefix=()):
        for name, command in sorted(group.commands.items()):
            if isinstance(command, click.Group):
                yield from leaves(command, (*prefix, name))
            else:
                yield (*prefix, name)

    commands = [(), *leaves(cli)]
    for command in commands:
        result = CliRunner().invoke(cli, [*command, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, (command, result.output)
    print(len(commands), "helps")
    """
)


def blocked(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


@pytest.mark.parametrize("module", EXTRAS["bench"])
def test_the_blocker_blocks(tmp_path: Path, module: str) -> None:
    script = tmp_path / "imports.py"
    script.write_text(f"import {module}\n", encoding="utf-8")
    done = blocked("--script", str(script))
    assert done.returncode == 1 and f"No module named '{module}'" in done.stderr


def test_every_help_works_without_the_extra(tmp_path: Path) -> None:
    script = tmp_path / "helps.py"
    script.write_text(EVERY_HELP, encoding="utf-8")
    done = blocked("--script", str(script))
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[0]) > 10


@pytest.mark.parametrize("tool", sorted(p.name for p in TOOLS.glob("[!_]*.py")))
def test_every_tool_help_works_without_the_extra(tool: str) -> None:
    done = blocked("--script", str(TOOLS / tool), "--help")
    assert done.returncode == 0, done.stderr[-2000:]


def test_readme_command_1_runs_without_the_extra(tmp_path: Path) -> None:
    done = blocked("build", "builtin:tiny", "--ladder", "32,64", "--cache-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "decode@64" in done.stdout


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["bench", "builtin:tiny", "--ladder", "32,64", "--new-tokens", "8"], "ovspec bench"),
        (["ab-compile", "builtin:tiny", "--plot", "p.png"], "ab-compile --plot"),
    ],
)
def test_a_command_needing_the_extra_names_it(tmp_path: Path, args: list[str], what: str) -> None:
    done = blocked(*args, "--cache-dir", str(tmp_path / "store"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"ovspec: error: {what} needs the 'bench' extra")
    assert line.endswith(INSTALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # refused before any work


def test_the_library_names_the_extra_too(monkeypatch: pytest.MonkeyPatch) -> None:
    class Block:
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            if name.split(".")[0] in EXTRAS["bench"]:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(sys, "meta_path", [Block(), *sys.meta_path])
    for name in [m for m in sys.modules if m.split(".")[0] in EXTRAS["bench"]]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "ovspec.bench.common.plots", raising=False)
    with pytest.raises(MissingExtraError, match="bench") as failed:
        require_extra("bench", "drawing")
    assert failed.value.exit_code == 2 and str(failed.value).endswith(INSTALL)
    with pytest.raises(MissingExtraError, match="the benchmark plots needs the 'bench' extra"):
        importlib.import_module("ovspec.bench.common.plots")  # not a parent's attribute
