"""Issue 29, items 8, 9, 13 and 14: crafted model inputs through real ``ovspec``
commands give one line on stderr and exit 2, never a traceback or a hang: GGUF headers
whose lengths and counts lie, a chat template that loops for hours, a config.json
nested past the parser's recursion, an IR cut short."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.testing.hostile import (
    ENDLESS_CHAT_TEMPLATE,
    deeply_nested_json,
    hostile_gguf_headers,
    truncated_ir,
    with_chat_template,
)

HEADERS = hostile_gguf_headers()


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_one_line(result: Result, needle: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ovspec: error: ") and needle in result.stderr


@pytest.mark.parametrize("name", sorted(HEADERS))
@pytest.mark.parametrize(
    "command",
    [
        ["doctor"],
        ["doctor", "--json"],
        ["generate", "--ids", "1,2", "--max-new-tokens", "2", "--ladder", "32"],
    ],
    ids=["doctor", "doctor-json", "generate"],
)
def test_a_crafted_gguf_header_is_one_line(tmp_path: Path, name: str, command: list[str]) -> None:
    gguf = tmp_path / "hostile.gguf"
    gguf.write_bytes(HEADERS[name])
    root = tmp_path / "store"
    result = invoke(command[0], str(gguf), *command[1:], "--cache-dir", str(root))
    assert_one_line(result, "has a damaged GGUF header")
    assert result.stdout == ""  # --json prints no half document
    assert not list((root / "models").glob("gguf-*"))  # nothing built


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
@pytest.mark.parametrize("command", ["doctor", "generate", "build"])
def test_a_deeply_nested_model_json_is_one_line(
    qwen2_dir: Path, tmp_path: Path, where: str, command: str
) -> None:
    model = tmp_path / "model"
    shutil.copytree(qwen2_dir, model)
    (model / where).write_text(deeply_nested_json(), encoding="utf-8")
    root = tmp_path / "store"
    args = [command, str(model), "--ladder", "32"]
    if command == "generate":
        args += ["hello", "--max-new-tokens", "2"]
    if command != "doctor":
        args += ["--cache-dir", str(root)]
    result = invoke(*args)
    if where == "generation_config.json" and command != "generate":
        assert result.exit_code == 0, result.output  # only generate reads the stop ids
        return
    assert_one_line(result, f"{model / where} is nested too deeply to parse")


@pytest.mark.parametrize("keep_fraction", [0.02, 0.5, 0.99])
@pytest.mark.parametrize("command", ["doctor", "doctor-json", "generate", "build"])
def test_a_truncated_ir_is_one_line(
    qwen2_dir: Path, tmp_path: Path, keep_fraction: float, command: str
) -> None:
    model = truncated_ir(qwen2_dir, tmp_path / "model", keep_fraction)
    root = tmp_path / "store"
    args = {
        "doctor": ["doctor", str(model)],
        "doctor-json": ["doctor", str(model), "--json"],
        "generate": ["generate", str(model), "--ids", "1,2", "--max-new-tokens", "2"],
        "build": ["build", str(model)],
    }[command]
    result = invoke(*args, "--ladder", "32", "--cache-dir", str(root))
    assert_one_line(result, "is cut short")
    assert result.stdout == ""  # no report of a model that could not be read


def test_a_chat_template_that_loops_for_hours_is_stopped(qwen2_dir: Path, tmp_path: Path) -> None:
    model = with_chat_template(qwen2_dir, tmp_path / "model", ENDLESS_CHAT_TEMPLATE)
    root = tmp_path / "store"
    args = ["generate", str(model), "--chat", "hi", "--max-new-tokens", "2", "--ladder", "64"]
    result = invoke(*args, "--cache-dir", str(root))
    assert_one_line(result, "did not finish within")
    assert result.stdout == ""


def test_a_chat_template_still_renders_in_its_child(qwen2_dir: Path, tmp_path: Path) -> None:
    # The same ids as genai's tokenizer in this process (the bound changes nothing else).
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(qwen2_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], True)
    expected = tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
    args = ["generate", str(qwen2_dir), "--chat", "hi", "--max-new-tokens", "2", "--ladder", "64"]
    result = invoke(*args, "--json", "--cache-dir", str(tmp_path / "store"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["prompt_ids"] == expected
