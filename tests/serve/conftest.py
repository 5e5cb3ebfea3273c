"""A server for the serve tests: the tiny Qwen2 fixture behind ``ovspec serve``'s app,
run by uvicorn on a thread on a free port, with an API key."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder
from ovspec.serve.app import ServerSettings
from ovspec.serve.server import ServeOptions, bind, build_app

DATA = Path(__file__).parents[1] / "data"
API_KEY = "test-key"
MODEL_NAME = "qwen2-tiny"
LADDER = "32,64,128,1024"  # room for a long stream to abandon
MAX_SEQUENCES = 4
MAX_REQUEST_BYTES = 64 * 1024
STARTUP_S = 120.0  # a bound for a loaded machine, not a measurement


@dataclass(frozen=True)
class RunningServer:
    url: str  # the OpenAI base URL, .../v1
    root: str  # http://host:port
    store: Path


@contextlib.contextmanager
def running_server(store: Path, max_sequences: int, max_queue: int) -> Iterator[RunningServer]:
    options = ServeOptions(
        model_dir=ModelDir.open(DATA / "qwen2"),
        settings=ServerSettings(
            model_name=MODEL_NAME, api_key=API_KEY, max_request_bytes=MAX_REQUEST_BYTES
        ),
        ladder=Ladder.parse(LADDER),
        store_root=store,
        prefill_chunk_tokens=16,
        max_sequences=max_sequences,
        max_queue=max_queue,
        port=0,
    )
    sock = bind(options.host, 0)
    app = build_app(options)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_S
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    host, port = sock.getsockname()[:2]
    try:
        yield RunningServer(f"http://{host}:{port}/v1", f"http://{host}:{port}", store)
    finally:
        uv.should_exit = True
        thread.join()
        sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("store"), MAX_SEQUENCES, max_queue=16) as up:
        yield up
