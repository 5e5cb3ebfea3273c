"""``ovspec generate``: generation over a ladder, streaming text (or ids) as it goes.

Reads the prompt as text (through the model's tokenizer IR), as a chat message (through
its chat template) or as token ids, generates with the lazy loader and a growing KV
(greedy, or sampled with openvino-genai's settings), and reports rungs, boundaries, events.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    INT_LIST,
    MAX_TOKEN_ID,
    SEED,
    TOKEN_ID,
    FiniteFloatRange,
    cache_dir_option,
    chunk_option,
    device_options,
    emit_json,
    json_option,
    ladder_option,
    load_mode_option,
    open_store,
    remote_options,
    split_option,
    tokens_range,
)
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.runtime.generation import Generation
    from ovspec.runtime.sampling import GenerationConfig
    from ovspec.runtime.textcodec import TextStream
    from ovspec.store.remote import RemoteConfig

F = TypeVar("F", bound=Callable[..., Any])

# Kept as literals so `ovspec --help` does not import openvino; a test checks they
# match ovspec.loader.Policy and ovspec.kv.KVLayout.
POLICY_CHOICES = ("one_ahead", "eager", "on_demand", "auto")
KV_LAYOUT_CHOICES = ("copy-and-grow", "shared-max", "remap")


def sampling_options(func: F) -> F:
    """openvino-genai's GenerationConfig settings, same names and meanings. The command
    gets them, with its own --max-new-tokens and --ignore-eos, as one ``sampling``: a
    ``GenerationConfig`` still without the model's EOS ids."""
    options = [
        click.option(
            "--do-sample",
            is_flag=True,
            help="Sample (multinomial) instead of greedy; the options below shape it.",
        ),
        click.option(
            "--temperature",
            type=FiniteFloatRange(0, 100),
            default=1.0,
            show_default=True,
            help="Softmax temperature (with --do-sample).",
        ),
        click.option(
            "--top-k",
            type=click.IntRange(0, MAX_TOKEN_ID),
            default=0,
            show_default=True,
            help="Sample among the K most likely tokens; 0 = all (with --do-sample).",
        ),
        click.option(
            "--top-p",
            type=FiniteFloatRange(0, 1),
            default=1.0,
            show_default=True,
            help="Sample in the smallest set whose probability exceeds P (with --do-sample).",
        ),
        click.option(
            "--repetition-penalty",
            type=FiniteFloatRange(0, 100),
            default=1.0,
            show_default=True,
            help="Divide (x if negative: multiply) logits of prompt and generated ids; 1 = off.",
        ),
        click.option(
            "--rng-seed",
            type=SEED,
            default=0,
            show_default=True,
            help="Seed of the sampler: the same seed gives the same tokens.",
        ),
        click.option(
            "--stop-token-id",
            "stop_token_ids",
            type=TOKEN_ID,
            multiple=True,
            help="Stop when this id is generated (beside the model's EOS); repeatable.",
        ),
        click.option(
            "--stop-string",
            "stop_strings",
            multiple=True,
            help="Stop when the text contains this string (cut from the output); repeatable.",
        ),
        click.option(
            "--include-stop-str-in-output",
            is_flag=True,
            help="Keep the matched stop string in the output.",
        ),
    ]
    names: tuple[str, ...] = ("max_new_tokens", "ignore_eos", "do_sample", "temperature")
    names += ("top_k", "top_p", "repetition_penalty", "rng_seed", "stop_strings")
    names += ("include_stop_str_in_output",)

    @functools.wraps(func)
    def collect(*args: Any, **kwargs: Any) -> Any:
        from ovspec.runtime.sampling import GenerationConfig

        settings: dict[str, Any] = {name: kwargs.pop(name) for name in names}
        stop_ids = frozenset(kwargs.pop("stop_token_ids"))
        kwargs["sampling"] = GenerationConfig(stop_token_ids=stop_ids, **settings)
        return func(*args, **kwargs)

    command: Any = collect
    for option in reversed(options):
        command = option(command)
    return cast(F, command)


@cli.command()
@click.argument("model")
@click.argument("prompt", required=False)
@click.option("--ids", "ids", type=INT_LIST, default=None, help="Prompt as token ids: 1,2,3.")
@click.option(
    "--chat",
    "chat",
    default=None,
    help="A user message, put through the model's chat template (PROMPT is used as is).",
)
@click.option(
    "--max-new-tokens",
    type=tokens_range(),
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
    help="When rungs compile: the successor in the background, all up front, at the "
    "boundary, or auto (chosen per request from known costs; one ahead without them).",
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
@load_mode_option
@split_option(False)
@device_options
@cache_dir_option
@remote_options
@click.option("--ignore-eos", is_flag=True, help="Generate --max-new-tokens even past EOS.")
@sampling_options
@json_option
def generate(
    model: str,
    prompt: str | None,
    ids: list[int] | None,
    chat: str | None,
    ladder: Ladder,
    chunk_tokens: int,
    policy: str,
    kv_layout: str,
    load_mode: str | None,
    split: bool,
    device: str,
    config: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    remote: RemoteConfig | None,
    sampling: GenerationConfig,
    as_json: bool,
) -> None:
    """Generate from PROMPT (text), --chat or --ids with MODEL (folder, .gguf or builtin:PRESET).

    Greedy unless --do-sample. Text goes to stdout as tokens arrive, then a one-line
    summary to stderr. A text prompt needs the model's openvino_tokenizer.xml; unlike
    openvino-genai's generate(text), PROMPT is not put through the chat template: --chat is.
    """
    if sum(x is not None for x in (prompt, ids, chat)) != 1:
        raise click.UsageError(
            "give exactly one of PROMPT (text), --chat (a message) or --ids (token ids)"
        )

    from ovspec.ir.model_dir import resolve_model, writes_into_store
    from ovspec.runtime.decoding import Tuning
    from ovspec.runtime.decoding import open as open_loader
    from ovspec.runtime.generation import generate as run_generation
    from ovspec.runtime.kv import KVLayoutWarning
    from ovspec.runtime.loader import Policy
    from ovspec.runtime.prompting import Prompt
    from ovspec.runtime.textcodec import TextCodec, eos_token_ids
    from ovspec.store.local import Store

    root = cache_dir if cache_dir is not None else Store.default_root()
    # As in build: validate before the store is opened, except for a built-in model or
    # a GGUF file, whose IR is written into the store's models/ folder.
    store = open_store(root, remote) if writes_into_store(model) else None
    try:
        model_dir = resolve_model(model, store.models_folder if store else None)
        codec = TextCodec.for_model(model_dir, model)
        asked = Prompt(prompt, chat, tuple(ids) if ids is not None else None)
        prompt_ids = asked.token_ids(model_dir, codec, model)
        settings = dataclasses.replace(sampling, eos_token_ids=eos_token_ids(model_dir))
        store = store or open_store(root, remote)
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
            load_mode=load_mode,
            tuning=Tuning(split=split),
        ) as loader:
            generation = run_generation(
                loader,
                prompt_ids,
                settings,
                codec=codec,
                streamer=write.token,
            )
            used_load_mode = loader.load_mode.value
        write.finish()
    finally:
        if store is not None:
            store.close()

    if as_json:
        document = _json_document(generation, prompt_ids)
        document["load_mode"] = used_load_mode
        if codec.can_decode:
            document["text"] = codec.decode(generation.token_ids)
        emit_json(document)
        return
    click.echo(_summary(generation), err=True)


class _Writer:
    """Streams each generated token to stdout: text increments, or ids with no detokenizer."""

    def __init__(self, stream: TextStream | None, quiet: bool) -> None:
        self._stream = stream
        self._quiet = quiet
        self._count = 0

    def token(self, token_id: int) -> bool:
        self._count += 1
        if self._quiet:
            return False
        if self._stream is not None:
            piece = self._stream.push(token_id)
        else:
            piece = f"{' ' if self._count > 1 else ''}{token_id}"
        if piece:
            click.echo(piece, nl=False)  # click.echo flushes: the text appears per token
        return False

    def finish(self) -> None:
        if self._quiet:
            return
        if self._stream is not None:
            click.echo(self._stream.finish(), nl=False)
        click.echo("")


def _json_document(generation: Generation, prompt_ids: list[int]) -> dict[str, object]:
    result = generation.decoded
    return {
        "prompt_ids": prompt_ids,
        "token_ids": list(generation.token_ids),
        "stop_reason": generation.stop_reason.value,
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


def _summary(generation: Generation) -> str:
    result = generation.decoded
    n = len(generation.token_ids)
    stopped = {"eos": " (stopped at EOS)", "stop_string": " (stopped at a stop string)"}
    boundaries = len(result.boundaries)
    wait_s = sum(b.program_wait_s for b in result.boundaries)
    # The first token comes from the prefill; each later one costs a decode step.
    decode_s = result.finished_s - result.first_token_s
    run = len(result.token_ids)  # before stop-string trimming: what the model ran
    rate = f"{(run - 1) / decode_s:.1f} tokens/s" if run > 1 and decode_s > 0 else "n/a tokens/s"
    return (
        f"{n} tokens{stopped.get(generation.stop_reason.value, '')}; "
        f"rungs {','.join(map(str, result.rungs))}; "
        f"{boundaries} {'boundary' if boundaries == 1 else 'boundaries'} "
        f"(program wait {wait_s:.3f} s); "
        f"first token {result.first_token_s:.3f} s (foreground compile wall); decode {rate}; "
        f"KV {result.kv_layout}" + (f" ({result.kv_note})" if result.kv_note else "")
    )
