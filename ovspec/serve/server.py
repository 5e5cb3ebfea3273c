"""Starting a server: the paged loader, the engine and the model's text opened in
order (the batched graph compiled before the socket accepts), then uvicorn on a socket
bound up front, so a caller knows the address before the first request.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ovspec.errors import BadRequestError, arg
from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder
from ovspec.runtime.decoding import open as open_loader
from ovspec.runtime.options import DEFAULT_LADDER, DEFAULT_PREFILL_CHUNK_TOKENS
from ovspec.runtime.paged import PagedLoader
from ovspec.serve.app import ServerSettings, create_app
from ovspec.serve.engine import Engine, EngineStats
from ovspec.serve.text import ModelText


@dataclass(frozen=True)
class ServeOptions:
    """One server: the model over a ladder, the batch's size, the queue, the address."""

    model_dir: ModelDir
    settings: ServerSettings
    ladder: Ladder = DEFAULT_LADDER
    device: str = "CPU"
    properties: Mapping[str, str] = field(default_factory=dict)
    store_root: Path | None = None
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    max_sequences: int = 4
    max_queue: int = 64
    host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        if self.max_sequences < 1 or self.max_queue < 1:
            raise BadRequestError(
                f"{arg('max_sequences')} and {arg('max_queue')} must be at least 1"
            )


def build_app(
    options: ServeOptions, on_stopped: Callable[[EngineStats], None] | None = None
) -> FastAPI:
    """The app over a started engine: the batched graph is compiled when this returns."""
    text = ModelText(options.model_dir, options.settings.model_name)
    loader = open_loader(
        options.model_dir.root,
        ladder=options.ladder,
        device=options.device,
        properties=dict(options.properties),
        store=options.store_root,
        prefill_chunk_tokens=options.prefill_chunk_tokens,
        load_mode="paged",
    )
    if not isinstance(loader, PagedLoader):  # pragma: no cover - load_mode is forced
        loader.close()
        raise BadRequestError("serving needs the paged graph")
    with contextlib.ExitStack() as undo:
        undo.callback(loader.close)
        engine = Engine(loader, options.max_sequences, options.max_queue)
        undo.pop_all()
    engine.start()
    return create_app(engine, text, options.settings, on_stopped)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one); refused in one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BadRequestError(
            f"cannot listen on {host}:{port}: {exc.strerror}; pick another {arg('port')}"
        ) from exc
    sock.listen(128)
    return sock


def serve(
    options: ServeOptions,
    on_ready: Callable[[str], None],
    on_stopped: Callable[[EngineStats], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM: running requests get the grace period, then the
    engine cancels what is left. ``on_ready`` gets the base URL once requests queue,
    ``on_stopped`` the engine's totals once it closed (uvicorn then re-raises the
    signal, so the process ends as the signal ends it)."""
    sock = bind(options.host, options.port)
    try:
        app = build_app(options, on_stopped)
        host, port = sock.getsockname()[:2]
        config = uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=int(options.settings.shutdown_grace_s) + 1,
        )
        on_ready(f"http://{_url_host(host)}:{port}/v1")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
