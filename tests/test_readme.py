"""The README's examples run: every block marked ``<!-- readme: runnable -->`` is run
against a fresh store, so an example that stops working fails CI.

``console`` blocks: each ``$ `` line is one shell command (a ``#`` comment after it is
dropped). ``python`` blocks run whole in a fresh interpreter. Commands run from the
repository's top, with this interpreter's ``ovspec`` first on PATH, in an environment
stripped of what ovspec reads (OVSPEC_*, AWS_*, the cache folder's XDG variable). What a
command's comment claims of its output is checked where ``EXPECTATIONS`` names it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- readme: runnable -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*```(\w+)\n(.*?)```", re.S)
# The README must keep at least this many runnable examples (the test cannot pass empty).
MIN_EXAMPLES = 9


def runnable_examples() -> list[tuple[str, str]]:
    """(kind, code) per example: one per ``$`` line, one per python block."""
    examples: list[tuple[str, str]] = []
    for kind, body in BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if kind == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    command = re.sub(r"\s+#.*$", "", line[2:]).strip()
                    examples.append(("shell", command))
        elif kind == "python":
            examples.append(("python", body))
        else:
            raise AssertionError(f"a runnable README block is {kind!r}, not console or python")
    return examples


EXAMPLES = runnable_examples()


def test_the_readme_keeps_its_runnable_examples() -> None:
    assert len(EXAMPLES) >= MIN_EXAMPLES


# What ovspec reads from the environment, besides OVSPEC_*: the S3 client's AWS_*
# settings, and the platform's cache folder (the store's default root).
ENV_PREFIXES = ("OVSPEC_", "AWS_")
ENV_NAMES = ("XDG_CACHE_HOME", "PYTHONWARNINGS")


def clean_environment(store: Path) -> dict[str, str]:
    """This process's environment without anything that changes what ovspec does, plus
    a fresh store and this interpreter's ``ovspec`` first on PATH."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(ENV_PREFIXES) and name not in ENV_NAMES
    }
    env["OVSPEC_CACHE_DIR"] = str(store)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# The README's real GGUF file; CI runs its commands on a tiny one the suite writes.
README_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def suite_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ovspec.testing.gguf import write_gguf

    return write_gguf("qwen2", tmp_path_factory.mktemp("readme-gguf") / "tiny.gguf", "Q8_0")


def test_the_first_real_model_runs_on_the_suite_gguf() -> None:
    assert any(README_GGUF in code for _, code in EXAMPLES)


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # One store for the whole README, as a reader's session would have. Built from
    # os.environ at module setup, before any per-test fixture: hence the explicit strip.
    return clean_environment(tmp_path_factory.mktemp("readme-store"))


def all_hits_nothing_compiled(stdout: str) -> None:
    """The second ``build --json``: every specialization a hit, none compiled."""
    totals = json.loads(stdout)["totals"]
    entries = json.loads(stdout)["entries"]
    assert entries and all(e["hit"] for e in entries), entries
    assert totals["misses"] == 0 and totals["hits"] == len(entries), totals
    assert totals["compile_s"] == 0, totals


def only_specialization_differs(stdout: str) -> None:
    """``cache explain decode@32 decode@64``: the specialization differs, nothing else."""
    from ovspec.store.keys import COMPONENT_NAMES

    named = {line.strip() for line in stdout.splitlines()[1:] if not line.startswith(" ")}
    assert named == {"specialization"}, stdout
    assert f"1 of {len(COMPONENT_NAMES)} components differ" in stdout.splitlines()[0], stdout


# What the README's comments claim of a command's output, checked; a command renamed in
# the README without its check here fails test_every_expectation_names_a_readme_command.
EXPECTATIONS: dict[str, Callable[[str], None]] = {
    "ovspec build builtin:tiny --ladder 32,64,128 --json": all_hits_nothing_compiled,
    "ovspec cache explain decode@32 decode@64 --model builtin:tiny": only_specialization_differs,
}


def test_every_expectation_names_a_readme_command() -> None:
    commands = [code for kind, code in EXAMPLES if kind == "shell"]
    assert set(EXPECTATIONS) <= set(commands), set(EXPECTATIONS) - set(commands)


def test_the_environment_is_clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OVSPEC_REMOTE", "s3://somewhere/else")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    env = clean_environment(tmp_path)
    assert not [n for n in env if n.startswith("AWS_") or n == "OVSPEC_REMOTE"]
    assert env["OVSPEC_CACHE_DIR"] == str(tmp_path)


@pytest.mark.parametrize(
    ("kind", "code"), EXAMPLES, ids=[code.splitlines()[0][:60] for _, code in EXAMPLES]
)
def test_readme_example_runs(
    kind: str, code: str, environment: dict[str, str], suite_gguf: Path
) -> None:
    code = code.replace(README_GGUF, str(suite_gguf))
    argv = ["bash", "-c", code] if kind == "shell" else [sys.executable, "-c", code]
    result = subprocess.run(
        argv, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{code}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    check = EXPECTATIONS.get(code)
    if check is not None:
        check(result.stdout)
