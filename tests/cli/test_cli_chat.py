"""``ovspec chat`` in a real terminal (a pty): answers stream, the KV is kept across
turns, /reset, /save, /load and /info work, a bad file is one line and the chat goes on;
``generate --session`` continues a saved chat from a script."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401 - registers the commands
from ovspec.cli import cli

LAUNCH = "from ovspec.cli import main; main()"
REPO = Path(__file__).resolve().parents[2]


class Terminal:
    """A child process on a pseudo-terminal, read until a pattern shows up."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self._master, slave = os.openpty()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.seen = ""

    def expect(self, pattern: str, timeout_s: float = 180.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, self.seen)
            if found is not None:
                self.seen = self.seen[found.end() :]
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-2000:]!r}"
            if select.select([self._master], [], [], left)[0]:
                try:
                    chunk = os.read(self._master, 1 << 16)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"the chat ended before {pattern!r}: {self.seen[-2000:]!r}"
                self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")

    def send(self, line: str) -> None:
        os.write(self._master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.process.wait(timeout=60)
        finally:
            os.close(self._master)


def _turn(terminal: Terminal, text: str) -> dict[str, object]:
    terminal.send(text)
    found = terminal.expect(r"(\{\"text\".*\})\n")
    document: dict[str, object] = json.loads(found.group(1))
    return document


@pytest.mark.parametrize("as_json", [False, True], ids=["streaming", "json"])
def test_chat_in_a_terminal_keeps_the_kv_and_resets_saves_and_loads(
    qwen2_dir: Path, tmp_path: Path, as_json: bool
) -> None:
    argv = [sys.executable, "-c", LAUNCH, "chat", str(qwen2_dir), "--ladder", "64,128,256"]
    argv += ["--max-new-tokens", "12", "--cache-dir", str(tmp_path / "store")]
    argv += ["--system", "You are terse."] + (["--json"] if as_json else [])
    terminal = Terminal(argv, tmp_path)
    saved = tmp_path / "chat.ovsession"
    if not as_json:
        terminal.expect("commands: /reset")
        terminal.send("Hello there")
        terminal.expect(r"Hello there\n.+\n> ")  # the echo, a streamed answer, a prompt
        terminal.send("/info")
        before = terminal.expect(r"\((\d+) tokens, (\d+) in the KV on rung (\d+), 3 messages\)")
        terminal.send(f"/save {saved}")
        terminal.expect(r"\(saved [\d,]+ bytes")
        terminal.send("/reset")
        terminal.expect(r"\(conversation reset\)")
        terminal.send("/info")
        terminal.expect(r"\(0 tokens, 0 in the KV on rung \d+, 1 messages\)")
        terminal.send(f"/load {saved}")
        after = terminal.expect(r"\(loaded .*: (\d+) tokens, (\d+) in the KV on rung (\d+)")
        assert after.groups() == before.groups()[:3]
        terminal.send(f"/load {tmp_path}")
        terminal.expect(r"ovspec: error: cannot read the session .*\n")
        terminal.send("/quit")
        assert terminal.close() == 0
        return
    first = _turn(terminal, "Hello there")
    second = _turn(terminal, "And again?")
    assert first["reused_tokens"] == 0
    # Turn 2 prefilled only its own message (and the end of answer 1), nothing earlier.
    earlier = int(str(first["tokens"]))
    assert int(str(second["prefilled_tokens"])) < int(str(second["tokens"])) - earlier + 2
    terminal.send(f"/save {saved}")
    terminal.expect(r"\"saved\"")
    terminal.send("/reset")
    terminal.expect(r"\"reset\": true")
    third = _turn(terminal, "Hello there")
    assert third["reused_tokens"] == int(str(first["prefilled_tokens"])) - int(
        str(third["prefilled_tokens"])
    )  # the system prompt came from the prefix cache
    assert third["token_ids"] == first["token_ids"]
    terminal.send(f"/load {saved}")
    loaded = json.loads(terminal.expect(r"(\{\"loaded\".*\})\n").group(1))
    assert loaded["tokens"] == second["tokens"]
    terminal.send("/quit")
    assert terminal.close() == 0


def test_generate_session_continues_a_saved_chat(qwen2_dir: Path, tmp_path: Path) -> None:
    saved = tmp_path / "chat.ovsession"
    store = tmp_path / "store"
    common = ["--ladder", "64,128,256", "--max-new-tokens", "8", "--cache-dir", str(store)]
    script = f"Hello there\n/save {saved}\nSecond message\n/quit\n"
    chatted = subprocess.run(
        [sys.executable, "-c", LAUNCH, "chat", str(qwen2_dir), *common, "--json"],
        input=script,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    expected = [json.loads(line) for line in chatted.stdout.splitlines() if '"text"' in line][1]
    result = CliRunner().invoke(
        cli,
        [
            "generate",
            str(qwen2_dir),
            "--chat",
            "Second message",
            "--session",
            str(saved),
            *common,
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["token_ids"] == expected["token_ids"]
    assert document["prefilled_tokens"] == expected["prefilled_tokens"]
    saved.write_bytes(saved.read_bytes()[:-40])
    refused = CliRunner().invoke(
        cli, ["generate", str(qwen2_dir), "--chat", "x", "--session", str(saved), *common]
    )
    assert refused.exit_code == 2
    assert refused.stderr.strip().count("\n") == 0 and "damaged or truncated" in refused.stderr
