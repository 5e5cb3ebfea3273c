"""The server's limits: one slot and one queue place, so a third request is turned away
with 429 while the first runs and the second waits; the queue frees as they leave."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import API_KEY, MODEL_NAME, running_server

LONG = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1000, "ignore_eos": True}


def test_a_full_queue_answers_429_and_the_server_recovers(tmp_path: Path) -> None:
    with running_server(tmp_path, max_sequences=1, max_queue=1) as server:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        api = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
        with httpx.Client(timeout=60) as http:
            url = f"{server.url}/completions"
            with http.stream("POST", url, json={**LONG, "stream": True}, headers=headers) as a:
                lines = a.iter_lines()  # held: a dropped iterator would close the stream
                next(line for line in lines if line.startswith("data:"))  # A is running
                # B waits for A's slot (its headers come at once: its stream has begun).
                with (
                    http.stream("POST", url, json={**LONG, "stream": True}, headers=headers),
                    pytest.raises(openai.RateLimitError, match="already waiting"),
                ):
                    api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
        # Both streams closed: once the server sees the disconnects (its next write to
        # each, or the waiter's next check) their sequences are cancelled and the queue
        # frees; until then a request may still be turned away.
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
                break
            except openai.RateLimitError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
