"""``ovspec generate``: generation over a ladder, streaming text (or ids) as it goes.

Reads the prompt as text (through the model's tokenizer IR), as a chat message (through
its chat template) or as token ids, generates with the lazy loader and a growing KV
(greedy, or sampled with openvino-genai's settings), and reports rungs, boundaries, events.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
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
    check_device,
    checked_model,
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
from ovspec.cli.perfmetrics import PerfMetrics
from ovspec.cli.prompts import asked_prompt, check_before_store
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.runtime.generation import Generation
    from ovspec.runtime.peer import PropertyDifference
    from ovspec.runtime.prompting import Prompt
    from ovspec.runtime.sampling import GenerationConfig
    from ovspec.runtime.textcodec import TextCodec, TextStream
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
    help="A user message, put through the model's chat template (PROMPT is used as is); "
    "- reads it from stdin.",
)
@click.option(
    "--prompt-file",
    type=click.Path(dir_okay=True, path_type=Path, allow_dash=True),
    default=None,
    help="Read PROMPT from this UTF-8 file (- for stdin).",
)
@click.option(
    "--chat-file",
    type=click.Path(dir_okay=True, path_type=Path, allow_dash=True),
    default=None,
    help="Read the --chat message from this UTF-8 file (- for stdin).",
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
@click.option(
    "--session",
    "session_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Continue the conversation saved in this file (by `ovspec chat`'s /save).",
)
@click.option(
    "--prewarm",
    is_flag=True,
    help="Wait at exit for a rung build still running (by default it is left unfinished: "
    "the answer is complete and nothing will use it).",
)
@sampling_options
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@click.option(
    "--verbose", "-v", is_flag=True, help="Add the technical summary: rungs, KV layout, events."
)
@json_option
def generate(
    model: str,
    prompt: str | None,
    ids: list[int] | None,
    chat: str | None,
    prompt_file: Path | None,
    chat_file: Path | None,
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
    prewarm: bool,
    sampling: GenerationConfig,
    quiet: bool,
    verbose: bool,
    as_json: bool,
    session_file: Path | None = None,
) -> None:
    """Generate from PROMPT (text), --chat or --ids with MODEL (folder, .gguf or builtin:PRESET).

    Greedy unless --do-sample. Text goes to stdout as tokens arrive, then a one-line
    summary to stderr. A text prompt needs the model's openvino_tokenizer.xml; unlike
    openvino-genai's generate(text), PROMPT is not put through the chat template: --chat is.
    PROMPT or --chat as -, or --prompt-file/--chat-file: the text from stdin or a file.
    Slow first steps (GGUF conversion, first compile) say so on stderr unless --quiet.
    """
    asked = asked_prompt(prompt, chat, ids, prompt_file, chat_file)
    if session_file is not None:  # a saved chat, one more message
        opening = (model, ladder, chunk_tokens, load_mode, device, config, cache_dir)
        return _continue_session(session_file, asked, opening, remote, sampling, as_json)

    from ovspec.ir.model_dir import resolve_model
    from ovspec.runtime.decoding import Tuning, check_prompt_ids, check_request_fits
    from ovspec.runtime.decoding import open as open_loader
    from ovspec.runtime.generation import generate as run_generation
    from ovspec.runtime.kv import KVLayoutWarning
    from ovspec.runtime.loader import Policy
    from ovspec.runtime.peer import genai_differences
    from ovspec.runtime.textcodec import TextCodec, eos_token_ids
    from ovspec.store.local import Store

    say = _progress_line(quiet)
    abandoned: tuple[str, ...] = ()
    root = cache_dir if cache_dir is not None else Store.default_root()
    # Every check that needs no store runs before one is opened or a built-in model is
    # written into it: bad input leaves the store as it was.
    facts = checked_model(model, ladder)
    check_device(device, dict(config))
    check_before_store(asked, facts, ladder, sampling.max_new_tokens, bool(sampling.stop_strings))
    store = None
    try:
        if facts.model_dir is not None:
            model_dir = facts.model_dir
        else:
            store = open_store(root, remote)
            model_dir = resolve_model(model, store.models_folder, announce=say)
        codec = TextCodec.for_model(model_dir, model)
        prompt_ids = asked.token_ids(model_dir, codec, model)
        check_prompt_ids(prompt_ids, None, ladder.top_tokens)  # a tokenized prompt's length
        check_request_fits(ladder, prompt_ids, None, sampling.max_new_tokens)
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
            used_load_mode = loader.load_mode.value
            say(_first_graph_note(used_load_mode, device))
            generation = run_generation(
                loader, prompt_ids, settings, codec=codec, streamer=write.token
            )
            differences = genai_differences(loader)
            # Builds no token of this answer needs: not waited for unless asked.
            abandoned = () if prewarm else loader.builds_in_flight()
            loader.close(wait_for_builds=not abandoned)
        write.finish()
    finally:
        # An abandoned build may still use the store: the process exits past it.
        if store is not None and not abandoned:
            store.close()

    _report(generation, prompt_ids, codec, used_load_mode, abandoned, differences, as_json, verbose)


def _continue_session(
    session_file: Path,
    asked: Prompt,
    opening: tuple[Any, ...],
    remote: RemoteConfig | None,
    sampling: GenerationConfig,
    as_json: bool,
) -> None:
    from ovspec.cli.sessions import OpenSettings, continue_saved

    ids = list(asked.ids) if asked.ids is not None else None
    settings = OpenSettings(*opening)
    continue_saved(session_file, asked.text, asked.chat, ids, settings, remote, sampling, as_json)


def _report(
    generation: Generation,
    prompt_ids: list[int],
    codec: TextCodec,
    load_mode: str,
    abandoned: tuple[str, ...],
    differences: Sequence[PropertyDifference],
    as_json: bool,
    verbose: bool,
) -> None:
    """The run's account: one JSON document on stdout, or the summary line on stderr."""
    if as_json:
        document = _json_document(generation, prompt_ids)
        document |= {"load_mode": load_mode, "abandoned_builds": list(abandoned)}
        document["genai_differences"] = [d.as_json() for d in differences]
        document["perf_metrics"] = PerfMetrics.of(generation.decoded).to_json()
        if codec.can_decode:
            document["text"] = codec.decode(generation.token_ids)
        emit_json(document)
        return
    left = f"; left {', '.join(abandoned)} unbuilt (--prewarm waits)" if abandoned else ""
    click.echo(_plain_summary(generation) + left, err=True)
    if verbose:
        click.echo(_summary(generation), err=True)


def _progress_line(quiet: bool) -> Callable[[str], None]:
    """Says on stderr what a slow step is doing, before it starts (stdout stays the
    text, or the one JSON document)."""
    if quiet:
        return lambda _message: None
    return lambda message: click.echo(f"ovspec: {message}", err=True)


def _first_graph_note(load_mode: str, device: str) -> str:
    if load_mode == "import":
        return f"loading the first graph on {device} from the store (compiled if missing)..."
    return f"compiling the first graph on {device}; the first token waits for it..."


def _plain_summary(generation: Generation) -> str:
    """One line a newcomer reads: how many tokens, why it stopped, how fast."""
    n = len(generation.token_ids)
    stopped = {
        "eos": "stopped at the model's end-of-text token",
        "stop_string": "stopped at a stop string",
    }.get(generation.stop_reason.value, "reached --max-new-tokens")
    result = generation.decoded
    grew = " -> ".join(map(str, result.rungs))
    kv = f"KV grew {grew} tokens" if len(result.rungs) > 1 else f"KV {grew} tokens"
    metrics = PerfMetrics.of(result).describe()
    return f"{n} tokens ({stopped}); {metrics}; {kv} (--verbose for details)"


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
        "ready_s": round(result.ready_s, 6),
        "first_token_s": round(result.first_token_s, 6),
        "finished_s": round(result.finished_s, 6),
    }


def _summary(generation: Generation) -> str:
    result = generation.decoded
    n = len(generation.token_ids)
    stopped = {"eos": " (stopped at EOS)", "stop_string": " (stopped at a stop string)"}
    boundaries = len(result.boundaries)
    wait_s = sum(b.program_wait_s for b in result.boundaries)
    return (
        f"{n} tokens{stopped.get(generation.stop_reason.value, '')}; "
        f"rungs {','.join(map(str, result.rungs))}; "
        f"{boundaries} {'boundary' if boundaries == 1 else 'boundaries'} "
        f"(program wait {wait_s:.3f} s); "
        f"first token {result.first_token_s:.3f} s (foreground compile wall); "
        f"KV {result.kv_layout}" + (f" ({result.kv_note})" if result.kv_note else "")
    )
