"""Opening a chat on a model for ``ovspec chat`` and ``generate --session``, and running
one turn of a saved chat from a script.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ovspec.cli.options import emit_json, open_store
from ovspec.ladder import Ladder

if TYPE_CHECKING:
    from ovspec.runtime.chatting import ChatSession
    from ovspec.runtime.sampling import GenerationConfig
    from ovspec.store.remote import RemoteConfig


@dataclass(frozen=True)
class OpenSettings:
    """How ``chat`` and ``generate --session`` open the model."""

    model: str
    ladder: Ladder
    chunk_tokens: int
    load_mode: str | None
    device: str
    config: tuple[tuple[str, str], ...]
    cache_dir: Path | None


@contextlib.contextmanager
def chat_session(
    opening: OpenSettings,
    remote: RemoteConfig | None,
    sampling: GenerationConfig,
    system: str | None,
    overflow: str = "refuse",
    keep_first_tokens: int = 0,
) -> Iterator[tuple[ChatSession, GenerationConfig]]:
    """A chat on the opened model, and the sampling settings with the model's EOS ids."""
    from ovspec.ir.model_dir import resolve_model
    from ovspec.runtime.chatting import ChatSession
    from ovspec.runtime.conversation import Conversation
    from ovspec.runtime.decoding import open as open_loader
    from ovspec.runtime.prefixcache import PrefixCache
    from ovspec.runtime.templating import ChatRenderer
    from ovspec.runtime.textcodec import TextCodec, eos_token_ids
    from ovspec.store.local import Store

    root = opening.cache_dir if opening.cache_dir is not None else Store.default_root()
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(open_store(root, remote))
        model_dir = resolve_model(opening.model, store.models_folder)
        codec = TextCodec.for_model(model_dir, opening.model)
        settings = dataclasses.replace(sampling, eos_token_ids=eos_token_ids(model_dir))
        renderer = ChatRenderer(model_dir, opening.model)
        stack.callback(renderer.close)
        loader = open_loader(
            model_dir.root,
            ladder=opening.ladder,
            device=opening.device,
            properties=dict(opening.config),
            store=store,
            prefill_chunk_tokens=opening.chunk_tokens,
            load_mode=opening.load_mode,
        )
        stack.callback(loader.close)
        conversation = Conversation(
            loader, overflow, keep_first_tokens, prefix_cache=PrefixCache(store)
        )
        session = ChatSession(conversation, renderer, codec, system)
        stack.callback(session.close)
        yield session, settings


def continue_saved(
    session_file: Path,
    prompt: str | None,
    chat: str | None,
    ids: list[int] | None,
    opening: OpenSettings,
    remote: RemoteConfig | None,
    sampling: GenerationConfig,
    as_json: bool,
) -> None:
    """``generate --session FILE``: the saved chat, one more message (or text, or ids)
    answered, the text streamed (or one JSON document); the file is left as it was."""
    with chat_session(opening, remote, sampling, None) as (session, settings):
        session.load(session_file)
        stream = None if as_json else (lambda piece: click.echo(piece, nl=False))
        if chat is not None:
            turn, answer = session.say(chat, settings, stream)
        else:
            conversation = session.conversation
            added = list(ids) if ids is not None else session.encode(prompt or "")
            conversation.append(added)
            turn = conversation.generate(settings)
            answer = session.decode(turn.token_ids)
            if stream is not None:
                stream(answer)
        if not as_json:
            click.echo("")
            return
        emit_json(
            {
                "text": answer,
                "token_ids": list(turn.token_ids),
                "stop_reason": turn.stop_reason.value,
                "prefilled_tokens": turn.prefilled_tokens,
                **counts(session),
            }
        )


def counts(session: ChatSession) -> dict[str, int]:
    conversation = session.conversation
    return {
        "tokens": len(conversation.tokens),
        "live_tokens": conversation.live_tokens,
        "capacity_tokens": conversation.capacity_tokens,
        "messages": len(session.messages),
    }
