"""``ovspec serve`` as a user runs it: --help, one line and exit 2 for bad input, the
address as one JSON line with --json, and SIGTERM ending a running stream and the
process cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
from click.testing import CliRunner
from conftest import API_KEY, DATA, MODEL_NAME

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli

ROOT = Path(__file__).resolve().parents[2]
EXIT_S = 120.0  # a hang guard on a loaded machine, not a measurement


def test_help_names_the_endpoints() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    assert "/v1/chat/completions" in result.output and "--max-sequences" in result.output


def test_a_missing_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "nothing"), "--cache-dir", "x"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        args = ["serve", str(DATA / "qwen2"), "--port", port, "--cache-dir", str(tmp_path)]
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "cannot listen" in result.stderr and result.stderr.count("\n") == 1


def test_sigterm_ends_a_running_stream_and_the_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OVSPEC_API_KEY": API_KEY}
    command = [sys.executable, "-c", "from ovspec.cli import main; main()", "serve"]
    command += [str(DATA / "qwen2"), "--served-model-name", MODEL_NAME, "--port", "0"]
    command += ["--ladder", "32,1024", "--shutdown-grace", "0", "--cache-dir", str(tmp_path)]
    process = subprocess.Popen(
        [*command, "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        api = openai.OpenAI(base_url=ready["url"], api_key=API_KEY, max_retries=0)
        answer = api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3)
        assert answer.usage is not None and answer.usage.completion_tokens >= 1

        started, lines = threading.Event(), []

        def listen() -> None:
            body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1000, "stream": True}
            body["ignore_eos"] = True
            headers = {"Authorization": f"Bearer {API_KEY}"}
            url = f"{ready['url']}/completions"
            try:
                with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as reply:
                    for line in reply.iter_lines():
                        lines.append(line)
                        started.set()
            except httpx.HTTPError:
                pass  # the server cut the stream: what a shutdown may do
            started.set()

        reader = threading.Thread(target=listen)
        reader.start()
        assert started.wait(EXIT_S)
        process.send_signal(signal.SIGTERM)
        rest, stderr = process.communicate(timeout=EXIT_S)
        reader.join(EXIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # uvicorn re-raises the signal once it has shut down: the process ends as SIGTERM
    # ends it, after the engine closed and said so.
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr
    assert json.loads(rest.splitlines()[-1])["stopped"] is True, rest
    tokens = [line for line in lines if line.startswith("data: {")]
    assert 0 < len(tokens) < 1000  # begun, then cut short by the shutdown
