"""Generation a runtime can ship: a ``GenerationConfig`` applied over ``decode``.

Owns the checks a request gets at the edge (ids inside the vocabulary, a non-empty
prompt that fits the top rung), stopping (stop token ids, EOS, stop strings, a
streamer that asks to stop) and streaming that never shows text a stop string later
takes back. Semantics follow openvino-genai's ``GenerationConfig`` and sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from ovspec.errors import BadRequestError
from ovspec.runtime.decoding import DecodeResult, decode
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import Loader
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.sampling import GenerationConfig, TokenChooser
from ovspec.runtime.textcodec import TextCodec

# A streamer gets each generated token id once it is final; returning True stops
# generation (genai's callback convention).
Streamer = Callable[[int], bool | None]


class StopReason(Enum):
    EOS = "eos"  # a stop token id (the model's EOS or config.stop_token_ids)
    STOP_STRING = "stop_string"
    MAX_NEW_TOKENS = "max_new_tokens"
    STREAMER = "streamer"


@dataclass(frozen=True)
class Generation:
    """What one ``generate`` call produced. ``token_ids`` is after stop-string trimming;
    ``decoded`` keeps everything the model was run on."""

    token_ids: tuple[int, ...]
    stop_reason: StopReason
    decoded: DecodeResult


def generate(
    loader: Loader | PagedLoader,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    codec: TextCodec | None = None,
    streamer: Streamer | None = None,
    kv_layout: KVLayout | None = None,
    release_passed_rungs: bool | None = None,
) -> Generation:
    """Generate from ``prompt_ids`` through the loader's ladder under ``config``.

    Stop strings need ``codec`` (its detokenizer). While they are set, the streamer lags
    the model by a window of tokens (the longest stop string's token count), as genai's
    does, so no streamed token is later taken back.
    """
    # decode() checks the prompt (emptiness, vocabulary, length) before anything compiles.
    matcher = _StopStrings(config, codec) if config.stop_strings else None
    stop_ids = config.stop_ids
    generated: list[int] = []
    streamed = 0
    reason = StopReason.MAX_NEW_TOKENS

    def stream_until(end: int) -> bool:
        nonlocal streamed
        asked = False
        while streamed < end:
            asked = bool(streamer(generated[streamed])) if streamer is not None else False
            streamed += 1
            if asked:
                break
        return asked

    def on_token(token: int) -> bool:
        nonlocal reason
        generated.append(token)
        if token in stop_ids:
            reason = StopReason.EOS
            return True
        if matcher is not None and matcher.matched(generated):
            reason = StopReason.STOP_STRING
            return True
        window = matcher.window_tokens if matcher is not None else 0
        if stream_until(len(generated) - window):
            reason = StopReason.STREAMER
            return True
        return False

    result = decode(
        loader,
        prompt_ids,
        max_new_tokens=config.max_new_tokens,
        kv_layout=kv_layout,
        on_token=on_token,
        release_passed_rungs=release_passed_rungs,
        choose=TokenChooser(config, prompt_ids),
    )
    if matcher is not None and reason is StopReason.STOP_STRING:
        del generated[len(generated) - matcher.tokens_to_remove(generated) :]
    if reason is not StopReason.STREAMER:
        stream_until(len(generated))  # the held-back window; a stop request changes nothing
    return Generation(tuple(generated), reason, result)


class _StopStrings:
    """genai's stop-string match: decode the last ``window_tokens`` generated tokens and look
    for any stop string in that text.

    genai's window is the longest stop string's own token count, which misses a string
    the model spells with more tokens ("ab" generated as "a" + "b"). Every token holds at
    least one byte, so a window of the string's UTF-8 length cannot miss it: ovspec uses
    the larger of the two (the streamer lags by that many tokens).
    """

    def __init__(self, config: GenerationConfig, codec: TextCodec | None) -> None:
        if codec is None or not codec.can_decode or not codec.can_encode:
            raise BadRequestError(
                "stop strings need the model's tokenizer and detokenizer IRs; "
                "use stop token ids instead"
            )
        self._codec = codec
        self._strings = config.stop_strings
        self._include = config.include_stop_str_in_output
        self.window_tokens = max(
            max(len(codec.encode(s)), len(s.encode("utf-8"))) for s in self._strings
        )
        self._match: tuple[int, str] | None = None

    def matched(self, generated: Sequence[int]) -> bool:
        text = self._codec.decode(generated[-self.window_tokens :])
        for stop in self._strings:
            at = text.find(stop)
            if at >= 0:
                self._match = (at + (len(stop) if self._include else 0), text)
                return True
        return False

    def tokens_to_remove(self, generated: Sequence[int]) -> int:
        """How many trailing tokens go so the output ends before the stop string (or after
        it, with include_stop_str_in_output), trailing spaces and newlines trimmed."""
        assert self._match is not None
        end, text = self._match
        keep = text[:end].rstrip(" \n")
        window = list(generated[-self.window_tokens :])
        if not keep:
            return len(window)
        for i in range(len(window)):
            if keep in self._codec.decode(window[: i + 1]):
                return len(window) - i - 1
        return 0
