"""``generate``'s prompt as the user gives it: text or a chat message from the command
line, a file (``--prompt-file``, ``--chat-file``) or stdin (``-``), and the checks a
prompt can get before the store is opened or a model written into it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ovspec.errors import BadRequestError

if TYPE_CHECKING:
    from ovspec.ir.preflight import ModelFacts
    from ovspec.ladder import Ladder
    from ovspec.runtime.prompting import Prompt

STDIN = "-"
# A prompt file larger than this is refused before it is read (a wrong path, not a prompt).
MAX_PROMPT_FILE_BYTES = 64 * 2**20


def asked_prompt(
    text: str | None,
    chat: str | None,
    ids: list[int] | None,
    text_file: Path | None,
    chat_file: Path | None,
) -> Prompt:
    """Exactly one of a text, a chat message (either from a file or stdin) or ids."""
    import click

    from ovspec.runtime.prompting import Prompt

    text = prompt_text(text, text_file, "PROMPT", "--prompt-file")
    chat = prompt_text(chat, chat_file, "--chat", "--chat-file")
    if sum(x is not None for x in (text, chat, ids)) != 1:
        raise click.UsageError(
            "give exactly one of PROMPT (text), --chat (a message) or --ids (token ids)"
        )
    return Prompt(text, chat, tuple(ids) if ids is not None else None)


def prompt_text(
    argument: str | None, file: Path | None, argument_name: str, file_option: str
) -> str | None:
    """The text given as ``argument`` (``-``: stdin) or in ``file`` (``-``: stdin); None
    when neither is given; trailing line ends dropped. BadRequestError (one line) for
    both at once, a file that is missing, unreadable, too large, not UTF-8, or blank."""
    if argument is not None and file is not None:
        raise BadRequestError(f"give {argument_name} or {file_option}, not both")
    if file is not None:
        return _read(file, file_option)
    if argument == STDIN:
        return _read(Path(STDIN), f"{argument_name} -")
    return argument


def _read(path: Path, where: str) -> str:
    source = "stdin" if str(path) == STDIN else str(path)
    try:
        if str(path) == STDIN:
            data = sys.stdin.buffer.read(MAX_PROMPT_FILE_BYTES + 1)
        else:
            with path.open("rb") as f:
                data = f.read(MAX_PROMPT_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BadRequestError(f"{where}: {source} does not exist") from None
    except IsADirectoryError:
        raise BadRequestError(f"{where}: {source} is a folder, not a text file") from None
    except OSError as exc:
        raise BadRequestError(f"{where}: cannot read {source} ({exc.strerror})") from None
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise BadRequestError(
            f"{where}: {source} is over {MAX_PROMPT_FILE_BYTES // 2**20} MiB; not a prompt"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(
            f"{where}: {source} is not UTF-8 text (byte {exc.start:,} is not UTF-8)"
        ) from None
    if not text.strip():
        raise BadRequestError(f"{where}: {source} holds no text; give a prompt")
    # Trailing line ends are dropped, as the shell's "$(cat FILE)" drops them: `echo Hi |`
    # and a file saved by an editor give the prompt typed on the command line.
    return text.rstrip("\r\n")


def check_before_store(
    asked: Prompt, facts: ModelFacts, ladder: Ladder, max_new_tokens: int, stop_strings: bool
) -> None:
    """What can be refused about ``asked`` on ``facts`` alone: an empty text, a text or
    chat message (or ``stop_strings``) for a model with no tokenizer, ids outside the
    vocabulary, or ids and ``max_new_tokens`` that outgrow the top rung. A tokenized
    prompt's length is checked once its tokenizer exists (a folder's before the store
    opens, a GGUF file's after its IR is built)."""
    from ovspec.runtime.decoding import check_prompt_ids, check_request_fits
    from ovspec.runtime.textcodec import TextCodec

    if asked.text is not None and not asked.text:
        raise BadRequestError("the prompt is empty; give some text")
    if asked.chat is not None and not asked.chat:
        raise BadRequestError("the chat message is empty; give some text")
    if stop_strings and not facts.has_tokenizer:
        raise BadRequestError(
            "stop strings need the model's tokenizer and detokenizer IRs; "
            "use stop token ids instead"
        )
    if asked.ids is not None:
        check_prompt_ids(asked.ids, facts.vocab_tokens, ladder.top_tokens)
        check_request_fits(ladder, asked.ids, None, max_new_tokens)
    elif not facts.has_tokenizer:
        if asked.chat is not None:
            raise BadRequestError(
                f"{facts.reference} has no tokenizer, hence no chat template; pass --ids "
                "with token ids"
            )
        TextCodec(None, None, facts.reference).encode(asked.text or "")  # refuses, naming --ids
