"""``ovspec serve``: an OpenAI-compatible server for MODEL over continuous batching.

Parses the request, compiles the batched paged graph, then serves until SIGINT/SIGTERM;
the address goes to stderr (or, with --json, one JSON line to stdout) once requests
are accepted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    FiniteFloatRange,
    cache_dir_option,
    chunk_option,
    device_options,
    json_option,
    ladder_option,
    model_folder,
)
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.serve.engine import EngineStats

API_KEY_ENV = "OVSPEC_API_KEY"


@cli.command()
@click.argument("model")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free."
)
@click.option("--served-model-name", default=None, help="The model id clients ask for [MODEL].")
@click.option(
    "--max-sequences",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Sequences decoded together in one batch; 1 serves one at a time.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(1, 100_000),
    default=64,
    show_default=True,
    help="Requests waiting for a slot before new ones get 429.",
)
@click.option(
    "--max-request-bytes",
    type=click.IntRange(1024, 1 << 30),
    default=1 << 20,
    show_default=True,
    help="Largest request body; larger ones get 413.",
)
@click.option(
    "--shutdown-grace",
    "shutdown_grace_s",
    type=FiniteFloatRange(0, 3600),
    default=10.0,
    show_default=True,
    help="Seconds running requests get to finish at SIGINT/SIGTERM before they are cancelled.",
)
@click.option(
    "--api-key-env",
    default=API_KEY_ENV,
    show_default=True,
    help="Environment variable holding the API key clients must send (unset: no key).",
)
@ladder_option
@chunk_option
@device_options
@cache_dir_option
@json_option
def serve(
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    max_sequences: int,
    max_queue: int,
    max_request_bytes: int,
    shutdown_grace_s: float,
    api_key_env: str,
    ladder: Ladder,
    chunk_tokens: int,
    device: str,
    config: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Serve MODEL (folder, .gguf or builtin:PRESET) with OpenAI's API on HOST:PORT.

    /v1/chat/completions, /v1/completions (streamed or not), /v1/models, /health and
    /metrics (Prometheus). Requests join one batch on the paged graph (CPU) as slots
    free up; its KV grows rung by rung with what the live sequences hold.
    """
    from ovspec.extras import require_extra

    require_extra("serve", "ovspec serve")
    from ovspec.serve.app import ServerSettings
    from ovspec.serve.server import ServeOptions
    from ovspec.serve.server import serve as run_server

    model_dir = model_folder(model, cache_dir)
    name = served_model_name or model
    options = ServeOptions(
        model_dir=model_dir,
        settings=ServerSettings(
            model_name=name,
            api_key=os.environ.get(api_key_env) or None,
            max_request_bytes=max_request_bytes,
            shutdown_grace_s=shutdown_grace_s,
        ),
        ladder=ladder,
        device=device,
        properties=dict(config),
        store_root=cache_dir,
        prefill_chunk_tokens=chunk_tokens,
        max_sequences=max_sequences,
        max_queue=max_queue,
        host=host,
        port=port,
    )

    def ready(url: str) -> None:
        if as_json:
            document = {"url": url, "model": name, "max_sequences": max_sequences}
            click.echo(json.dumps(document))  # one line: a caller reads it as it comes
        else:
            click.echo(f"ovspec serve: {name} on {url} ({max_sequences} sequences)", err=True)

    def stopped(stats: EngineStats) -> None:
        summary = {"generated_tokens": stats.generated_tokens, "cancelled": stats.cancelled}
        if as_json:
            click.echo(json.dumps({"stopped": True, **summary}))
        else:
            click.echo(
                f"ovspec serve: stopped after {stats.generated_tokens} tokens "
                f"({stats.cancelled} sequences cancelled)",
                err=True,
            )

    run_server(options, ready, stopped)
