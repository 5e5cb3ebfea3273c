"""Issue 10, items 8 and 9: bad ``generate`` and ``build`` input is refused at the edge
(exit 2, one line, nothing compiled or stored), and a store warning is printed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.store.local import Store

CLI = [sys.executable, "-c", "from ovspec.cli import main; main()"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_refused(result: Result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr


def stored(root: Path) -> int:
    if not root.exists():
        return 0
    with Store(root, strict=True) as store:
        return len(store.entries())


@pytest.mark.parametrize("ids", ["5,2048", "5,99999", "5,99999999999999999999999999"])
def test_token_ids_outside_the_vocabulary_are_refused(
    tiny_dir: Path, tmp_path: Path, ids: str
) -> None:
    root = tmp_path / "store"
    args = ["generate", str(tiny_dir), "--ids", ids, "--ladder", "32", "--max-new-tokens", "2"]
    result = invoke(*args, "--cache-dir", str(root))
    assert_refused(result, "outside the model's vocabulary [0, 2048)")
    assert stored(root) == 0  # refused before anything compiled


@pytest.mark.parametrize("command", ["build", "generate"])
@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("FOO=1", "has no property 'FOO'"),
        ("NUM_STREAM=2", "did you mean NUM_STREAMS"),
        ("INFERENCE_PRECISION_HINT=f33", "Wrong value f33"),
        ("NUM_STREAMS=many", "rejects the compile properties"),
    ],
)
def test_bad_config_properties_are_refused_before_compiling(
    tiny_dir: Path, tmp_path: Path, command: str, config: str, needle: str
) -> None:
    root = tmp_path / "store"
    args = [command, str(tiny_dir), "--ladder", "32", "--config", config, "--cache-dir", str(root)]
    if command == "generate":
        args += ["--ids", "1,2,3", "--max-new-tokens", "2"]
    assert_refused(invoke(*args), needle)
    assert stored(root) == 0


def test_a_store_warning_is_printed_once_on_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    args = ["generate", str(tiny_dir), "--ids", "1,2,3", "--max-new-tokens", "2", "--ladder", "32"]
    args += ["--load-mode", "import"]  # through the store, whose warning this is
    first = subprocess.run(
        [*CLI, *args, "--cache-dir", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    for blob in root.glob("blobs/*/*.blob"):
        blob.write_bytes(b"\0" * blob.stat().st_size)  # same size: only the checksum sees it
    again = subprocess.run(
        [*CLI, *args, "--cache-dir", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "default"},
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]
    corrupt = [line for line in again.stderr.splitlines() if "corrupt" in line]
    assert len(corrupt) == 2, again.stderr  # the prefill and the decode blob, once each
    assert all(line.startswith("ovspec: warning: ") for line in corrupt)
