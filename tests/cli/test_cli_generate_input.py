"""``generate``'s edges through the real command line: a prompt or chat message from a
file or stdin (issue 31 item 3), slow first steps said on stderr (item 4), and the
speed in openvino-genai's PerfMetrics terms (item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QWEN2 = str(ROOT / "tests" / "data" / "qwen2")
CLI = [sys.executable, "-c", "from ovspec.cli import main; main()"]
FEW = ["--max-new-tokens", "3", "--ladder", "32,64"]


def run(
    argv: list[str], cache_dir: Path, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVSPEC_", "AWS_"))}
    return subprocess.run(
        [*CLI, *argv, "--cache-dir", str(cache_dir)],
        input=stdin if stdin is not None else b"",
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )


def prompt_ids(result: subprocess.CompletedProcess[bytes]) -> list[int]:
    assert result.returncode == 0, result.stderr.decode()
    ids = json.loads(result.stdout)["prompt_ids"]
    assert isinstance(ids, list) and ids
    return ids


@pytest.fixture(scope="module")
def text_ids(tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    """The ids of the text given on the command line, the reference for the others."""
    store = tmp_path_factory.mktemp("reference")
    return prompt_ids(run(["generate", QWEN2, "Hello, wörld", *FEW, "--json"], store))


def test_prompt_from_stdin(text_ids: list[int], tmp_path: Path) -> None:
    result = run(
        ["generate", QWEN2, "-", *FEW, "--json"], tmp_path / "store", "Hello, wörld\n".encode()
    )
    assert prompt_ids(result) == text_ids


def test_prompt_from_a_file(text_ids: list[int], tmp_path: Path) -> None:
    file = tmp_path / "prompt.txt"
    file.write_text("Hello, wörld\r\n\n", encoding="utf-8")
    result = run(
        ["generate", QWEN2, "--prompt-file", str(file), *FEW, "--json"], tmp_path / "store"
    )
    assert prompt_ids(result) == text_ids


def test_chat_message_from_stdin_and_a_file(tmp_path: Path) -> None:
    message = "Why is the sky blue?"
    given = prompt_ids(
        run(["generate", QWEN2, "--chat", message, *FEW, "--json"], tmp_path / "store")
    )
    from_stdin = run(
        ["generate", QWEN2, "--chat", "-", *FEW, "--json"], tmp_path / "store", message.encode()
    )
    file = tmp_path / "message.txt"
    file.write_text(message, encoding="utf-8")
    from_file = run(
        ["generate", QWEN2, "--chat-file", str(file), *FEW, "--json"], tmp_path / "store"
    )
    assert prompt_ids(from_stdin) == given == prompt_ids(from_file)


@pytest.mark.parametrize(
    ("argv", "stdin", "needle"),
    [
        (["--prompt-file", "{tmp}/missing.txt"], None, "missing.txt does not exist"),
        (["--prompt-file", "{tmp}"], None, "is a folder"),
        (["--prompt-file", "{tmp}/latin1.txt"], None, "is not UTF-8"),
        (["--prompt-file", "{tmp}/blank.txt"], None, "holds no text"),
        (["-"], b"", "stdin holds no text"),
        (["--chat", "-"], b"\xff\xfe", "stdin is not UTF-8"),
        (["Hello", "--prompt-file", "{tmp}/prompt.txt"], None, "not both"),
        (["--chat", "Hi", "--chat-file", "{tmp}/prompt.txt"], None, "not both"),
        (["--chat-file", "{tmp}/prompt.txt", "--ids", "1"], None, "exactly one of"),
    ],
    ids=[
        "missing",
        "folder",
        "not-utf8",
        "blank",
        "empty-stdin",
        "stdin-not-utf8",
        "prompt-and-file",
        "chat-and-file",
        "chat-file-and-ids",
    ],
)
def test_bad_prompt_input_is_one_line(
    argv: list[str], stdin: bytes | None, needle: str, tmp_path: Path
) -> None:
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    (tmp_path / "prompt.txt").write_text("Hello", encoding="utf-8")
    store = tmp_path / "store"
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    result = run(["generate", QWEN2, *args, *FEW], store, stdin)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("ovspec: error: "), stderr
    assert needle in stderr
    assert not store.exists()


def test_slow_first_steps_are_said_on_stderr(tmp_path: Path) -> None:
    from ovspec.testing.gguf import write_gguf

    gguf = write_gguf("qwen2", tmp_path / "m.gguf", "Q8_0", seed=3)
    store = tmp_path / "store"
    first = run(["generate", str(gguf), "Hello", *FEW], store)
    stderr = first.stderr.decode()
    assert first.returncode == 0, stderr
    assert "converting m.gguf to an OpenVINO IR" in stderr
    assert "compiling the first graph" in stderr
    again = run(["generate", str(gguf), "Hello", *FEW, "--json"], store)
    assert again.returncode == 0, again.stderr.decode()
    json.loads(again.stdout)  # stdout stays one JSON document
    assert "converting" not in again.stderr.decode()  # once per file
    quiet = run(["generate", "builtin:tiny", "--ids", "1,2", *FEW, "--quiet"], store)
    assert quiet.returncode == 0 and quiet.stderr.decode().count("\n") == 1, quiet.stderr
    loud = run(["generate", "builtin:tiny", "--ids", "1,2", *FEW], tmp_path / "fresh")
    assert "writing the built-in model builtin:tiny" in loud.stderr.decode()


@pytest.mark.parametrize("load_mode", ["paged", "compile"])
def test_speed_is_reported_in_genai_terms(load_mode: str, tmp_path: Path) -> None:
    argv = ["generate", "builtin:tiny", "--ids", "1,2,3", "--max-new-tokens", "40"]
    argv += ["--ladder", "32,64", "--ignore-eos", "--load-mode", load_mode]
    result = run([*argv, "--json"], tmp_path / "store")
    assert result.returncode == 0, result.stderr.decode()
    document = json.loads(result.stdout)
    perf = document["perf_metrics"]
    n = len(document["token_ids"])
    assert perf["num_generated_tokens"] == n == 40
    assert perf["num_input_tokens"] == 3
    # genai's definitions, from the same run's record (rounding: the record keeps µs).
    assert perf["load_time_ms"] == pytest.approx(document["ready_s"] * 1000, abs=2e-3)
    ttft_ms = (document["first_token_s"] - document["ready_s"]) * 1000
    assert perf["ttft_ms"] == pytest.approx(ttft_ms, abs=2e-3)
    tpot_ms = (document["finished_s"] - document["first_token_s"]) * 1000 / (n - 1)
    assert perf["tpot_ms"] == pytest.approx(tpot_ms, abs=1e-3)
    # From the unrounded time per token: a 0.45 ms tpot rounded to µs is off by 0.1%.
    assert perf["throughput_tokens_per_s"] == pytest.approx(1000 / tpot_ms, rel=1e-3)
    human = run(argv, tmp_path / "store")
    summary = human.stderr.decode().splitlines()[-1]
    assert summary.startswith("40 tokens (reached --max-new-tokens); model ready in "), summary
    assert "TTFT" in summary and "TPOT" in summary and "tokens/s" in summary
    assert "page-aligned" not in summary and "rungs" not in summary
