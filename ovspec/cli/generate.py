"""``ovspec generate``: greedy generation over a ladder, streaming text (or ids) as it goes.

Reads the prompt as text (through the model's tokenizer IR) or as token ids, decodes
with the lazy loader and a growing KV, and reports the rungs, boundaries and events.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    INT_LIST,
    cache_dir_option,
    chunk_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
)
from ovspec.errors import BadRequestError
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.runtime.decoding import DecodeResult
    from ovspec.runtime.textcodec import TextStream

# Kept as literals so `ovspec --help` does not import openvino; a test checks they
# match ovspec.loader.Policy and ovspec.kv.KVLayout.
POLICY_CHOICES = ("one_ahead", "eager", "on_demand")
KV_LAYOUT_CHOICES = ("copy-and-grow", "shared-max", "remap")


@cli.command()
@click.argument("model")
@click.argument("prompt", required=False)
@click.option("--ids", "ids", type=INT_LIST, default=None, help="Prompt as token ids: 1,2,3.")
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Tokens to generate at most.",
)
@ladder_option
@chunk_option
@click.option(
    "--policy",
    type=click.Choice(POLICY_CHOICES),
    default="one_ahead",
    show_default=True,
    help="When rungs compile: the successor in the background, all up front, or at the boundary.",
)
@click.option(
    "--kv-layout",
    type=click.Choice(("auto", *KV_LAYOUT_CHOICES)),
    default="auto",
    show_default=True,
    help="KV sized to the rung and copied at a boundary, one top-rung buffer with views, or "
    "pages moved at a boundary (no copy; Linux, page-aligned rungs). auto: remap where it "
    "works, else copy-and-grow.",
)
@device_options
@cache_dir_option
@click.option("--ignore-eos", is_flag=True, help="Generate --max-new-tokens even past EOS.")
@json_option
def generate(
    model: str,
    prompt: str | None,
    ids: list[int] | None,
    max_new_tokens: int,
    ladder: Ladder,
    chunk_tokens: int,
    policy: str,
    kv_layout: str,
    device: str,
    config: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    ignore_eos: bool,
    as_json: bool,
) -> None:
    """Greedy-decode from PROMPT (text) or --ids with MODEL (folder or builtin:PRESET).

    Text goes to stdout as tokens arrive, then a one-line summary to stderr.
    A text prompt needs the model's openvino_tokenizer.xml.
    """
    if (prompt is None) == (ids is None):
        raise click.UsageError("give exactly one of PROMPT (text) or --ids (token ids)")

    from ovspec.ir.model_dir import BUILTIN_PREFIX, resolve_model
    from ovspec.runtime.decoding import decode
    from ovspec.runtime.decoding import open as open_loader
    from ovspec.runtime.kv import KVLayoutWarning
    from ovspec.runtime.loader import Policy
    from ovspec.runtime.textcodec import TextCodec, eos_token_ids
    from ovspec.store.local import Store

    root = cache_dir if cache_dir is not None else Store.default_root()
    # As in build: validate before the store is opened, except for a built-in model,
    # which is written into the store's models/ folder.
    store = Store(root) if model.startswith(BUILTIN_PREFIX) else None
    try:
        model_dir = resolve_model(model, root / "models")
        codec = TextCodec.for_model(model_dir, model)
        prompt_ids = codec.encode(prompt) if prompt is not None else list(ids or [])
        if prompt is not None and not prompt_ids:
            raise BadRequestError(f"the prompt {prompt!r} encodes to no tokens; give some text")
        stop_ids = frozenset() if ignore_eos else eos_token_ids(model_dir)
        store = store or Store(root)
        write = _Writer(codec.stream() if codec.can_decode else None, quiet=as_json)
        warnings.simplefilter("ignore", KVLayoutWarning)  # the summary carries its note
        with open_loader(
            model_dir.root,
            ladder=ladder,
            device=device,
            properties=dict(config),
            store=store,
            policy=Policy(policy),
            prefill_chunk_tokens=chunk_tokens,
            kv_layout=None if kv_layout == "auto" else kv_layout,  # remap: ladder checked here
        ) as loader:
            result = decode(
                loader,
                prompt_ids,
                max_new_tokens=max_new_tokens,
                stop_ids=stop_ids,
                on_token=write.token,
            )
        write.finish()
    finally:
        if store is not None:
            store.close()

    stopped_at_eos = bool(result.token_ids) and result.token_ids[-1] in stop_ids
    if as_json:
        document = _json_document(result, prompt_ids, stopped_at_eos)
        if codec.can_decode:
            document["text"] = codec.decode(result.token_ids)
        emit_json(document)
        return
    click.echo(_summary(result, stopped_at_eos), err=True)


class _Writer:
    """Streams each generated token to stdout: text increments, or ids with no detokenizer."""

    def __init__(self, stream: TextStream | None, quiet: bool) -> None:
        self._stream = stream
        self._quiet = quiet
        self._count = 0

    def token(self, token_id: int) -> None:
        self._count += 1
        if self._quiet:
            return
        if self._stream is not None:
            piece = self._stream.push(token_id)
        else:
            piece = f"{' ' if self._count > 1 else ''}{token_id}"
        if piece:
            click.echo(piece, nl=False)  # click.echo flushes: the text appears per token

    def finish(self) -> None:
        if self._quiet:
            return
        if self._stream is not None:
            click.echo(self._stream.finish(), nl=False)
        click.echo("")


def _json_document(
    result: DecodeResult, prompt_ids: list[int], stopped_at_eos: bool
) -> dict[str, object]:
    return {
        "prompt_ids": prompt_ids,
        "token_ids": list(result.token_ids),
        "stop_reason": "eos" if stopped_at_eos else "max_new_tokens",
        "rungs": list(result.rungs),
        "boundaries": [
            {
                "at_live_tokens": b.at_live_tokens,
                "from": b.migration.from_capacity_tokens,
                "to": b.migration.to_capacity_tokens,
                "migration_s": round(b.migration.seconds, 6),
                "copied_bytes": b.migration.copied_bytes,
                "program_wait_s": round(b.program_wait_s, 6),
            }
            for b in result.boundaries
        ],
        "events": [
            {
                "kind": e.kind.value,
                "spec": e.spec,
                "at_s": round(e.at_s, 6),
                "foreground": e.foreground,
                "seconds": round(e.seconds, 6),
                "note": e.note,
            }
            for e in result.events
        ],
        "kv_layout": result.kv_layout,
        "kv_note": result.kv_note,
        "first_token_s": round(result.first_token_s, 6),
        "finished_s": round(result.finished_s, 6),
    }


def _summary(result: DecodeResult, stopped_at_eos: bool) -> str:
    n = len(result.token_ids)
    boundaries = len(result.boundaries)
    wait_s = sum(b.program_wait_s for b in result.boundaries)
    # The first token comes from the prefill; each later one costs a decode step.
    decode_s = result.finished_s - result.first_token_s
    rate = f"{(n - 1) / decode_s:.1f} tokens/s" if n > 1 and decode_s > 0 else "n/a tokens/s"
    return (
        f"{n} tokens{' (stopped at EOS)' if stopped_at_eos else ''}; "
        f"rungs {','.join(map(str, result.rungs))}; "
        f"{boundaries} {'boundary' if boundaries == 1 else 'boundaries'} "
        f"(program wait {wait_s:.3f} s); "
        f"first token {result.first_token_s:.3f} s (foreground compile wall); decode {rate}; "
        f"KV {result.kv_layout}" + (f" ({result.kv_note})" if result.kv_note else "")
    )
