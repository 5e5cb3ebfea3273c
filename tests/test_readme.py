"""The README's examples run: every block marked ``<!-- readme: runnable -->`` is run
against a fresh store, so an example that stops working fails CI.

``console`` blocks: each ``$ `` line is one shell command (a ``#`` comment after it is
dropped). ``python`` blocks run whole in a fresh interpreter. Commands run from the
repository's top, with this interpreter's ``ovspec`` first on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # One store for the whole README, as a reader's session would have.
    env = dict(os.environ)
    env["OVSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("readme-store"))
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
