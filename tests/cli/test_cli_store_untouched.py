"""Every bad input is one line on stderr, exit 2, and leaves the store as it was: a fresh
``--cache-dir`` is not created (nor a built-in model written into it), and a populated
store keeps every name, size and mtime. Run through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QWEN2 = str(ROOT / "tests" / "data" / "qwen2")
CLI = [sys.executable, "-c", "from ovspec.cli import main; main()"]
TOO_LONG_PROMPT = ",".join(["1"] * 33)  # one more token than the top rung 32

# (id, argv): each is refused. Issue 31's list first, then one per kind of check.
BAD_INPUTS: list[tuple[str, list[str]]] = [
    ("generate-id-outside-vocab", ["generate", "builtin:tiny", "--ids", "1,2,999999"]),
    ("generate-text-without-tokenizer", ["generate", "builtin:tiny", "hello"]),
    (
        "generate-negative-temperature",
        ["generate", "builtin:tiny", "--ids", "1", "--temperature", "-1", "--do-sample"],
    ),
    ("build-unknown-device", ["build", "builtin:tiny", "--device", "FOO"]),
    ("build-huge-ladder", ["build", "builtin:tiny", "--ladder", "99999999999999999999"]),
    ("generate-unknown-preset", ["generate", "builtin:nope", "--ids", "1"]),
    ("generate-no-prompt", ["generate", "builtin:tiny"]),
    ("generate-two-prompts", ["generate", "builtin:tiny", "hi", "--ids", "1"]),
    (
        "generate-stop-string-without-tokenizer",
        ["generate", "builtin:tiny", "--ids", "1", "--stop-string", "x"],
    ),
    ("generate-chat-without-tokenizer", ["generate", "builtin:tiny", "--chat", "hi"]),
    (
        "generate-ladder-past-positions",
        ["generate", "builtin:tiny", "--ids", "1", "--ladder", "16K"],
    ),
    ("generate-unknown-device", ["generate", "builtin:tiny", "--ids", "1", "--device", "FOO"]),
    ("generate-unknown-property", ["generate", "builtin:tiny", "--ids", "1", "--config", "FOO=1"]),
    (
        "generate-prompt-over-top-rung",
        ["generate", "builtin:tiny", "--ids", TOO_LONG_PROMPT, "--ladder", "32"],
    ),
    (
        "generate-answer-over-top-rung",
        ["generate", "builtin:tiny", "--ids", "1", "--ladder", "32", "--max-new-tokens", "64"],
    ),
    ("generate-folder-text-over-top-rung", ["generate", QWEN2, "Hello " * 40, "--ladder", "32"]),
    ("generate-folder-id-outside-vocab", ["generate", QWEN2, "--ids", "1,999999"]),
    ("generate-folder-empty-prompt", ["generate", QWEN2, ""]),
    ("generate-missing-gguf", ["generate", "missing.gguf", "--ids", "1"]),
    ("generate-missing-folder", ["generate", "no/such/model", "--ids", "1"]),
    ("generate-missing-prompt-file", ["generate", QWEN2, "--prompt-file", "no/such.txt"]),
    ("build-unknown-preset", ["build", "builtin:nope"]),
    ("build-ladder-past-positions", ["build", "builtin:tiny", "--ladder", "16K"]),
    ("build-unknown-property", ["build", "builtin:tiny", "--config", "FOO=1"]),
    ("build-unknown-phase", ["build", "builtin:tiny", "--phases", "foo"]),
    ("build-missing-folder", ["build", "no/such/model"]),
    ("plan-unknown-preset", ["plan", "builtin:nope", "--measure-steps", "2"]),
    (
        "plan-ladder-past-positions",
        ["plan", "builtin:tiny", "--ladder", "16K", "--measure-steps", "2"],
    ),
    ("plan-unknown-device", ["plan", "builtin:tiny", "--device", "FOO", "--measure-steps", "2"]),
    ("doctor-unknown-preset", ["doctor", "builtin:nope"]),
    ("doctor-ladder-past-positions", ["doctor", "builtin:tiny", "--ladder", "16K"]),
    ("profile-unknown-preset", ["profile", "builtin:nope", "--rung", "32"]),
    ("profile-unknown-device", ["profile", "builtin:tiny", "--rung", "32", "--device", "FOO"]),
    ("profile-rung-past-positions", ["profile", "builtin:tiny", "--rung", "16384"]),
    ("bench-unknown-preset", ["bench", "builtin:nope", "--ladder", "32"]),
    ("bench-unknown-protocol", ["bench", "builtin:tiny", "--ladder", "32", "--protocols", "XX"]),
    ("push-without-remote", ["cache", "push", "builtin:tiny", "--ladder", "32"]),
    ("pull-without-remote", ["cache", "pull", "builtin:tiny", "--ladder", "32"]),
    (
        "pull-unknown-preset",
        ["cache", "pull", "builtin:nope", "--ladder", "32", "--remote", "s3://bucket/prefix"],
    ),
    (
        "push-unknown-device",
        ["cache", "push", "builtin:tiny", "--device", "FOO", "--remote", "s3://bucket/prefix"],
    ),
    ("ab-compile-unknown-preset", ["ab-compile", "builtin:nope", "--rungs", "32"]),
    ("ab-compile-unknown-phase", ["ab-compile", "builtin:tiny", "--rungs", "32", "--phase", "x"]),
    (
        "ab-compile-unknown-device",
        ["ab-compile", "builtin:tiny", "--rungs", "32", "--device", "FOO", "--pairs", "1"],
    ),
]


def clean_environment() -> dict[str, str]:
    """This interpreter's environment without anything ovspec or its S3 client reads."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OVSPEC_", "AWS_", "PYTHONPATH"))
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


def run(argv: list[str], cache_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv, "--cache-dir", str(cache_dir)],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime (ns); {} when there is none."""
    if not root.exists():
        return {}
    found: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            st = path.lstat()
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    st = root.lstat()
    found["."] = (0, st.st_mtime_ns)
    return found


def assert_refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ovspec: error: "), result.stderr


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the tiny model's folder and its decode@32 blob."""
    root = tmp_path_factory.mktemp("populated") / "store"
    argv = ["build", "builtin:tiny", "--ladder", "32", "--phases", "decode"]
    built = run(argv, root, ROOT)
    assert built.returncode == 0, built.stderr
    return root


@pytest.mark.parametrize("argv", [a for _, a in BAD_INPUTS], ids=[i for i, _ in BAD_INPUTS])
def test_bad_input_creates_no_store(argv: list[str], tmp_path: Path) -> None:
    root = tmp_path / "fresh-store"
    result = run(argv, root, ROOT)
    assert_refused(result)
    assert not root.exists() or not any(root.iterdir()), sorted(tree(root))


@pytest.mark.parametrize("argv", [a for _, a in BAD_INPUTS], ids=[i for i, _ in BAD_INPUTS])
def test_bad_input_leaves_a_populated_store_as_it_was(argv: list[str], populated: Path) -> None:
    before = tree(populated)
    assert any(name.startswith("models") for name in before)
    result = run(argv, populated, ROOT)
    assert_refused(result)
    assert tree(populated) == before
