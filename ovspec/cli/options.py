"""Typed click converters and the options many commands share.

One ``ParamType`` per value type, each with one failure path: the value type's own
validation error becomes click's usage error (exit 2, one line).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ovspec.cli import error_text
from ovspec.errors import OvspecError
from ovspec.ir.compression import Compression
from ovspec.ladder import DEFAULT_LADDER_TOKENS, MAX_CAPACITY_TOKENS, Ladder

if TYPE_CHECKING:
    from ovspec.ir.model_dir import ModelDir
    from ovspec.ir.preflight import ModelFacts
    from ovspec.store.local import Store
    from ovspec.store.remote import RemoteConfig

F = TypeVar("F", bound=Callable[..., Any])


class LadderType(click.ParamType[Ladder, Any]):
    name = "ladder"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Ladder):
            return value
        try:
            return Ladder.parse(str(value))
        except OvspecError as exc:
            self.fail(error_text(exc), param, ctx)


class CompressionType(click.ParamType[Compression, Any]):
    name = "compression"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Compression):
            return value
        try:
            return Compression.parse(str(value))
        except OvspecError as exc:
            self.fail(error_text(exc), param, ctx)


class KeyValueType(click.ParamType[tuple[str, str], Any]):
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; keys are OpenVINO property names."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        key, sep, val = str(value).partition("=")
        if not sep or not key.strip() or not val.strip():
            self.fail(f"{value!r} is not KEY=VALUE (e.g. INFERENCE_PRECISION_HINT=f32)", param, ctx)
        return key.strip(), val.strip()


class IntListType(click.ParamType[list[int], Any]):
    """``1,2,3`` -> ``[1, 2, 3]`` (token ids)."""

    name = "ids"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            self.fail(f"{value!r} is not a comma-separated list of token ids", param, ctx)
        return [int(p) for p in parts]


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange`` that also refuses nan (every comparison with nan is false,
    so a range alone lets it through) and, with both bounds set, every infinity."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if not math.isfinite(converted):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return converted


# Ranges of the numeric options (issue 29, item 15). Every number a command takes is
# bounded on both sides, and floats are finite: a value out of range is one line and
# exit 2 at the edge. tests/cli/test_cli_ranges.py walks every command's parameters and
# fails on a numeric one without both bounds.
MAX_TOKEN_ID = 2**31 - 1  # vocabularies are indexed by int32
MAX_SEED = 2**64 - 1  # openvino-genai's rng_seed is a size_t
MAX_JOBS = 256
MAX_REPEATS = 100_000  # pairs, runs, repetitions, timed steps
MAX_TIMEOUT_S = 7 * 24 * 3600.0
TOKEN_ID = click.IntRange(0, MAX_TOKEN_ID)
SEED = click.IntRange(0, MAX_SEED)


def tokens_range(min_tokens: int = 1) -> click.IntRange:
    """A token count (prompt, new tokens, chunk, rung, live positions)."""
    return click.IntRange(min_tokens, MAX_CAPACITY_TOKENS)


def repeats_range(min_count: int = 1) -> click.IntRange:
    """How many times something is done: pairs, runs, repetitions, timed steps."""
    return click.IntRange(min_count, MAX_REPEATS)


LADDER = LadderType()
COMPRESSION = CompressionType()
KEY_VALUE = KeyValueType()
INT_LIST = IntListType()


DEFAULT_LADDER_TEXT = ",".join(map(str, DEFAULT_LADDER_TOKENS))


def ladder_option(func: F) -> F:
    return click.option(
        "--ladder",
        type=LADDER,
        default=DEFAULT_LADDER_TEXT,
        show_default=True,
        help="KV capacities in tokens, smallest first (K = x1024).",
    )(func)


def phases_option(func: F) -> F:
    return click.option(
        "--phases",
        default="decode,prefill",
        show_default=True,
        help="Which graphs per rung: decode, prefill, or both.",
    )(func)


def chunk_option(func: F) -> F:
    return click.option(
        "--chunk",
        "chunk_tokens",
        type=tokens_range(),
        default=128,
        show_default=True,
        help="Prefill chunk in tokens (shrunk to the rung on small rungs).",
    )(func)


def load_mode_option(func: F) -> F:
    """How a loader brings in a rung; ``None`` (auto) leaves the device's default."""
    return click.option(
        "--load-mode",
        type=click.Choice(("auto", "compile", "import", "paged")),
        default="auto",
        show_default=True,
        callback=lambda _ctx, _param, value: None if value == "auto" else value,
        help="How a rung loads. import: blobs through the store (and --remote); compile: "
        "from the IR, the store unused. paged (CPU): one PagedAttention graph from the IR "
        "for the prompt and every step, the KV in blocks, no rung graphs. auto: the "
        "device's way (CPU: paged, or compile where rung graphs are asked for, since its "
        "import unpacks f16 weights to f32; other devices import).",
    )(func)


def split_option(default: bool | None) -> Callable[[F], F]:
    """``--split/--no-split``: decode on the device cores, compile in a process on the
    host cores (the CPU stand-in's NPU/host split). ``None``: on where >= 2 cores."""

    def decorate(func: F) -> F:
        return click.option(
            "--split/--no-split",
            "split",
            default=default,
            help="Device/host split: pin decoding to half the usable cores and build every "
            "graph in a process pinned to the others, through the store (load mode import). "
            + (
                "[default: on with >= 2 usable cores]"
                if default is None
                else f"[default: {'on' if default else 'off'}]"
            ),
        )(func)

    return decorate


def compress_option(func: F) -> F:
    return click.option(
        "--compress",
        "compression",
        type=COMPRESSION,
        default="none",
        show_default=True,
        help="Weight compression before specializing: none, int8, int4 or int4:GROUP.",
    )(func)


def blob_mode_option(func: F) -> F:
    return click.option(
        "--blob-mode",
        type=click.Choice(["weightless", "full"]),
        default="weightless",
        show_default=True,
        help="weightless: blobs point into the model's .bin (weights stored once per ladder).",
    )(func)


ENV_TRUST_SHARED_STORE = "OVSPEC_TRUST_SHARED_STORE"  # read by ovspec.store.trust


def _trust_shared_store(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """Set the variable the store reads, for this command only (restored on exit)."""
    if not value:
        return
    previous = os.environ.get(ENV_TRUST_SHARED_STORE)
    os.environ[ENV_TRUST_SHARED_STORE] = "1"

    def restore() -> None:
        if previous is None:
            os.environ.pop(ENV_TRUST_SHARED_STORE, None)
        else:
            os.environ[ENV_TRUST_SHARED_STORE] = previous

    ctx.call_on_close(restore)


def trust_shared_store_option(func: F) -> F:
    return click.option(
        "--trust-shared-store",
        is_flag=True,
        expose_value=False,
        callback=_trust_shared_store,
        help=(
            "Use a store another user owns or can write, read-only (nothing is written; "
            f"blobs are still verified). [env var: {ENV_TRUST_SHARED_STORE}=1]"
        ),
    )(func)


def cache_dir_option(func: F) -> F:
    func = trust_shared_store_option(func)
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="OVSPEC_CACHE_DIR",
        default=None,
        show_envvar=True,
        help="Store folder (default: the platform's user cache folder for ovspec).",
    )(func)


def remote_options(func: F) -> F:
    """``--remote`` and its two companions, passed on as one ``remote: RemoteConfig | None``."""
    from ovspec.store.remote import ENV_KEY_FILE, ENV_READ_ONLY, ENV_REMOTE, RemoteConfig

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        remote_url: str | None,
        remote_read_only: bool,
        remote_key_file: Path | None,
        **kwargs: Any,
    ) -> Any:
        remote = (
            RemoteConfig(remote_url, read_only=remote_read_only, key_file=remote_key_file)
            if remote_url
            else None
        )
        return func(*args, remote=remote, **kwargs)

    options = [
        click.option(
            "--remote",
            "remote_url",
            metavar="s3://BUCKET/PREFIX",
            envvar=ENV_REMOTE,
            show_envvar=True,
            default=None,
            help="A shared remote tier behind the store: local misses fetch from it, compiles "
            "upload to it. Endpoint and credentials: AWS_* variables or ~/.aws files.",
        ),
        click.option(
            "--remote-read-only",
            is_flag=True,
            envvar=ENV_READ_ONLY,
            show_envvar=True,
            help="Fetch from the remote, never upload to it.",
        ),
        click.option(
            "--remote-key-file",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=ENV_KEY_FILE,
            show_envvar=True,
            default=None,
            help="Manifest signing keys (KEY_ID:HEX_SECRET lines, mode 600): uploads are "
            "signed, and unsigned or mismatched manifests refused.",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def open_store(root: Path, remote: RemoteConfig | None, **kwargs: Any) -> Store:
    """The store at ``root``, with the remote tier ``remote`` behind it if one is given."""
    from ovspec.store.local import Store
    from ovspec.store.remote import open_remote

    return Store(root, remote=open_remote(remote) if remote is not None else None, **kwargs)


def checked_model(model: str, ladder: Ladder | None = None) -> ModelFacts:
    """MODEL checked and described without writing anything (no store is created, no
    built-in model written); with ``ladder``, its rungs checked against the model's
    position limit. Commands call it before any check that needs a store."""
    from ovspec.ir.preflight import model_facts

    facts = model_facts(model)
    if ladder is not None:
        ladder.check_fits(facts.max_position_embeddings)
    return facts


def check_device(device: str, properties: dict[str, str]) -> None:
    """An unknown device or a property it refuses: one line, before anything is written."""
    import openvino as ov

    from ovspec.compile.devices import profile_for

    profile_for(device, properties).resolve(ov.Core(), properties)


def model_folder(model: str, cache_dir: Path | None) -> ModelDir:
    """MODEL as a folder: a built-in preset or a .gguf is written into the store's
    models/ (the store is opened only for that, once MODEL is checked); a folder is
    used where it is."""
    from ovspec.ir.model_dir import resolve_model
    from ovspec.store.local import Store

    facts = checked_model(model)
    if facts.model_dir is not None:
        return facts.model_dir
    root = cache_dir if cache_dir is not None else Store.default_root()
    with Store(root) as store:
        return resolve_model(model, store.models_folder, announce=announce)


def announce(message: str) -> None:
    """A slow step about to start, on stderr (stdout stays a command's output)."""
    click.echo(f"ovspec: {message}", err=True)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")(func)


def device_options(func: F) -> F:
    func = click.option(
        "--config",
        "config",
        type=KEY_VALUE,
        multiple=True,
        help="OpenVINO compile property, repeatable (e.g. --config INFERENCE_PRECISION_HINT=f32).",
    )(func)
    return click.option(
        "--device",
        default="CPU",
        show_default=True,
        help="OpenVINO device (CPU, NPU, GPU...).",
    )(func)


@contextlib.contextmanager
def progress(length: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; silent otherwise (logs, pipes)."""
    if not sys.stderr.isatty():
        yield lambda _n: None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


def emit_json(document: object) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False))


def specialization_options(func: F) -> F:
    """--ladder, --phases, --chunk, --device/--config and --compress: what picks a build's
    specializations and their keys. ``build``, ``cache push`` and ``cache pull`` all take
    these, so a push or a pull names the blobs a build with the same options made."""
    for option in (compress_option, device_options, chunk_option, phases_option, ladder_option):
        func = option(func)
    return func


def store_options(func: F) -> F:
    """--blob-mode, --cache-dir (with --trust-shared-store) and the --remote options: where
    a build's blobs go and in which form (``build``, ``cache push``, ``cache pull``)."""
    for option in (remote_options, cache_dir_option, blob_mode_option):
        func = option(func)
    return func
