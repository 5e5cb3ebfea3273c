"""``ovspec serve`` through the official openai client: the same tokens as ``ovspec
generate`` (chat and completions, streamed and not, greedy and seeded), eight clients at
once, a client gone mid-stream, bad and oversized requests answered with OpenAI's error
body, and the server serving on after each."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner
from conftest import API_KEY, DATA, LADDER, MAX_REQUEST_BYTES, MODEL_NAME, RunningServer

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli

WAIT_S = 60.0  # bound for the server to settle after a disconnect (not a measurement)


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)


def generated(store: Path, *args: str) -> dict[str, object]:
    """``ovspec generate``'s JSON for the fixture over the server's ladder and chunk."""
    result = CliRunner().invoke(
        cli,
        [
            *("generate", str(DATA / "qwen2"), *args),
            *("--ladder", LADDER, "--chunk", "16", "--cache-dir", str(store), "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    document: dict[str, object] = json.loads(result.stdout)
    return document


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.root}/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found[1])


def test_completions_match_generate_whole_and_streamed(server: RunningServer) -> None:
    expected = generated(server.store, "Hello", "--max-new-tokens", "40")
    api = client(server)
    whole = api.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=40, temperature=0)
    assert whole.choices[0].text == expected["text"]
    assert whole.usage is not None
    assert whole.usage.completion_tokens == len(expected["token_ids"])  # type: ignore[arg-type]
    assert whole.choices[0].finish_reason == "length"
    stream = api.completions.create(
        model=MODEL_NAME, prompt="Hello", max_tokens=40, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert len(pieces) > 1 and "".join(pieces) == expected["text"]


def test_chat_matches_generate_chat_whole_and_streamed(server: RunningServer) -> None:
    expected = generated(server.store, "--chat", "Hi there", "--max-new-tokens", "30")
    api = client(server)
    messages = [{"role": "user", "content": "Hi there"}]
    whole = api.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=30,
        temperature=0,
    )
    assert whole.choices[0].message.content == expected["text"]
    stream = api.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(expected["token_ids"])  # type: ignore[arg-type]


def test_a_seeded_sample_matches_generate_with_the_seed(server: RunningServer) -> None:
    expected = generated(
        server.store,
        "Once",
        "--max-new-tokens",
        "25",
        "--do-sample",
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--rng-seed",
        "7",
    )
    got = client(server).completions.create(
        model=MODEL_NAME, prompt="Once", max_tokens=25, temperature=0.7, top_p=0.9, seed=7
    )
    assert got.choices[0].text == expected["text"]


def test_eight_concurrent_clients_each_get_their_own_answer(server: RunningServer) -> None:
    prompts = [f"Story {i}: " + "word " * (3 * i) for i in range(8)]
    api = client(server)

    def ask(prompt: str, stream: bool) -> str:
        if stream:
            chunks = api.completions.create(
                model=MODEL_NAME, prompt=prompt, max_tokens=24 + len(prompt) % 9,
                temperature=0, stream=True,
            )  # fmt: skip
            return "".join(c.choices[0].text for c in chunks if c.choices)
        answer = api.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=24 + len(prompt) % 9, temperature=0
        )
        return answer.choices[0].text

    alone = [
        generated(server.store, p, "--max-new-tokens", str(24 + len(p) % 9))["text"]
        for p in prompts
    ]
    steps_before = metric(server, "ovspec_batch_steps_total")
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts, [i % 2 == 0 for i in range(8)]))
    assert together == alone
    assert metric(server, "ovspec_batch_steps_total") > steps_before
    assert metric(server, "ovspec_running_sequences") == 0


def test_a_client_gone_mid_stream_frees_its_slot(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1000, "stream": True}
    body["ignore_eos"] = True  # the sequence would run ~1000 steps if nobody cancelled it
    headers = {"Authorization": f"Bearer {API_KEY}"}
    cancelled = metric(server, "ovspec_cancelled_sequences_total")
    generated_before = metric(server, "ovspec_generated_tokens_total")
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{server.url}/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line.startswith("data:"))
        next(events), next(events)  # two tokens in, then the client leaves
    deadline = time.monotonic() + WAIT_S
    while metric(server, "ovspec_running_sequences") != 0:
        assert time.monotonic() < deadline, "the abandoned sequence kept its slot"
        time.sleep(0.05)
    assert metric(server, "ovspec_cancelled_sequences_total") == cancelled + 1
    assert metric(server, "ovspec_generated_tokens_total") - generated_before < 1000
    answer = client(server).completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1


def test_bad_requests_get_openai_errors_and_the_server_serves_on(server: RunningServer) -> None:
    api = client(server)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    malformed = httpx.post(f"{server.url}/completions", content=b"{not json", headers=headers)
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=-3)
    with pytest.raises(openai.BadRequestError, match="over the top rung 1024"):
        api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        api.completions.create(model=MODEL_NAME, prompt="Hi", n=2)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        api.completions.create(model="gpt-4", prompt="Hi")
    with pytest.raises(openai.APIStatusError, match="over 65536 bytes") as too_big:
        api.completions.create(model=MODEL_NAME, prompt="x" * MAX_REQUEST_BYTES)
    assert too_big.value.status_code == 413
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()
    assert [m.id for m in api.models.list()] == [MODEL_NAME]
    assert httpx.get(f"{server.root}/health").json() == {"status": "ok"}
    answer = api.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1


def test_a_stop_string_ends_the_text_before_it(server: RunningServer) -> None:
    api = client(server)
    full = api.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=40, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = api.completions.create(
        model=MODEL_NAME, prompt="Hello", max_tokens=40, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = api.completions.create(
        model=MODEL_NAME, prompt="Hello", max_tokens=40, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text[: text.index(stop)]
