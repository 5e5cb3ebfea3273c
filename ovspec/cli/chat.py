"""``ovspec chat``: an interactive chat in the terminal over one conversation whose KV is
kept across turns, streaming each answer; ``/reset``, ``/save FILE``, ``/load FILE``,
``/info`` (rung, KV and token counts) and ``/quit`` between turns.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli import cli, error_text
from ovspec.cli.generate import sampling_options
from ovspec.cli.options import (
    cache_dir_option,
    chunk_option,
    device_options,
    json_option,
    ladder_option,
    load_mode_option,
    remote_options,
    tokens_range,
)
from ovspec.cli.sessions import OpenSettings, chat_session, counts
from ovspec.errors import OvspecError
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.runtime.chatting import ChatSession
    from ovspec.runtime.sampling import GenerationConfig
    from ovspec.store.remote import RemoteConfig

HELP_LINE = "commands: /reset, /save FILE, /load FILE, /info, /quit"


@cli.command()
@click.argument("model")
@click.option("--system", default=None, help="A system prompt (kept once in the prefix cache).")
@click.option(
    "--session",
    "session_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Continue the conversation saved in this file (/save writes one).",
)
@click.option(
    "--max-new-tokens",
    type=tokens_range(),
    default=256,
    show_default=True,
    help="Tokens per answer at most.",
)
@click.option(
    "--overflow",
    type=click.Choice(("refuse", "slide")),
    default="refuse",
    show_default=True,
    help="Past the top rung: refuse the turn, or keep the first --keep-first-tokens and the "
    "most recent tokens and prefill them afresh.",
)
@click.option(
    "--keep-first-tokens", type=tokens_range(0), default=0, help="What a slide keeps first."
)
@ladder_option
@chunk_option
@load_mode_option
@device_options
@cache_dir_option
@remote_options
@click.option("--ignore-eos", is_flag=True, help="Answer --max-new-tokens even past EOS.")
@sampling_options
@json_option
def chat(
    model: str,
    system: str | None,
    session_file: Path | None,
    overflow: str,
    keep_first_tokens: int,
    ladder: Ladder,
    chunk_tokens: int,
    load_mode: str | None,
    device: str,
    config: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    remote: RemoteConfig | None,
    sampling: GenerationConfig,
    as_json: bool,
) -> None:
    """Chat with MODEL (folder or .gguf with a chat template) in the terminal.

    Each line you type is a user message; the answer streams as it comes. The KV is kept
    between turns, so a turn prefills only its own tokens. With --json each turn is one
    JSON line (text, token counts, rung) instead of streamed text.
    """
    opening = OpenSettings(model, ladder, chunk_tokens, load_mode, device, config, cache_dir)
    with chat_session(opening, remote, sampling, system, overflow, keep_first_tokens) as (
        session,
        settings,
    ):
        if session_file is not None:
            session.load(session_file)
        _loop(session, settings, as_json)


def _loop(session: ChatSession, settings: GenerationConfig, as_json: bool) -> None:
    if not as_json:
        click.echo(HELP_LINE, err=True)
    while True:
        if not as_json:
            click.echo("> ", nl=False)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.startswith("/"):
            if not _command(session, text, as_json):
                break
            continue
        try:
            turn, answer = session.say(
                text, settings, None if as_json else lambda piece: click.echo(piece, nl=False)
            )
        except OvspecError as exc:
            click.echo(f"ovspec: error: {error_text(exc)}", err=True)
            continue
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "text": answer,
                        "token_ids": list(turn.token_ids),
                        "stop_reason": turn.stop_reason.value,
                        "prefilled_tokens": turn.prefilled_tokens,
                        "reused_tokens": turn.reused_tokens,
                        "first_token_s": round(turn.first_token_s, 6),
                        **counts(session),
                    }
                )
            )
        else:
            click.echo("")


def _command(session: ChatSession, text: str, as_json: bool) -> bool:
    """Run one /command; False ends the chat. A failed command is one line, the chat goes on."""
    name, _, argument = text.partition(" ")
    argument = argument.strip()
    try:
        if name == "/quit":
            return False
        if name == "/reset":
            session.reset()
            _say(as_json, {"reset": True}, "(conversation reset)")
        elif name in ("/save", "/load") and not argument:
            click.echo(f"ovspec: error: {name} needs a FILE", err=True)
        elif name == "/save":
            size = session.save(Path(argument))
            _say(
                as_json, {"saved": argument, "bytes": size}, f"(saved {size:,} bytes to {argument})"
            )
        elif name == "/load":
            session.load(Path(argument))
            found = counts(session)
            _say(as_json, {"loaded": argument, **found}, f"(loaded {argument}: {_info(found)})")
        elif name == "/info":
            found = counts(session)
            _say(as_json, found, f"({_info(found)})")
        else:
            click.echo(f"ovspec: error: unknown command {name}; {HELP_LINE}", err=True)
    except OvspecError as exc:
        click.echo(f"ovspec: error: {error_text(exc)}", err=True)
    return True


def _info(counts: dict[str, int]) -> str:
    return (
        f"{counts['tokens']} tokens, {counts['live_tokens']} in the KV on rung "
        f"{counts['capacity_tokens']}, {counts['messages']} messages"
    )


def _say(as_json: bool, document: Mapping[str, object], text: str) -> None:
    click.echo(json.dumps(document) if as_json else text)
