"""``generate``: greedy equals openvino-genai's LLMPipeline on every test model kind
(optimum exports, the built-in synthetic model; GGUF files in test_gguf_generation), and
equals plain ``decode`` token for token: the chooser leaves greedy as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
import pytest

import ovspec
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.decoding import decode
from ovspec.runtime.generation import StopReason, generate
from ovspec.runtime.sampling import GenerationConfig
from ovspec.store.local import Store

NEW_TOKENS = 70


def genai_greedy(model: Path, prompt: list[int]) -> list[int]:
    pipe = openvino_genai.LLMPipeline(str(model), "CPU", **EXACT_CPU_PROPERTIES)
    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens = NEW_TOKENS
    cfg.ignore_eos = True
    cfg.apply_chat_template = False
    ids = np.array(prompt, dtype=np.int64)[None]
    out = pipe.generate(
        openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), cfg
    )
    return [int(t) for t in out.tokens[0]]


@pytest.mark.parametrize("kind", ["qwen2", "llama", "tiny"])
def test_generate_greedy_equals_genai_and_decode(kind: str, tiny_dir: Path, store: Store) -> None:
    model = tiny_dir if kind == "tiny" else Path(__file__).parents[1] / "data" / kind
    prompt = list(range(40, 58))
    expected = genai_greedy(model, prompt)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    streamed: list[int] = []
    with ovspec.open(
        model, ladder="32,64,128", properties=EXACT_CPU_PROPERTIES, store=store
    ) as loader:
        got = generate(loader, prompt, config, streamer=lambda t: bool(streamed.append(t)))
        plain = decode(loader, prompt, max_new_tokens=NEW_TOKENS)
    assert list(got.token_ids) == expected == list(plain.token_ids)
    assert streamed == expected
    assert got.stop_reason is StopReason.MAX_NEW_TOKENS
    assert got.decoded.rungs == (32, 64, 128)


def test_a_streamer_can_stop_generation(tiny_dir: Path, store: Store) -> None:
    seen: list[int] = []

    def streamer(token: int) -> bool:
        seen.append(token)
        return len(seen) == 5

    with ovspec.open(tiny_dir, ladder="32", store=store) as loader:
        got = generate(loader, [3, 4], GenerationConfig(max_new_tokens=20), streamer=streamer)
    assert got.stop_reason is StopReason.STREAMER
    assert list(got.token_ids) == seen and len(seen) == 5


@pytest.mark.parametrize(
    ("prompt", "pattern"),
    [
        ([], r"the prompt is empty"),
        ([1, -1], r"token id -1 at prompt position 1 is outside the model's vocabulary \[0, 10\)"),
        ([10, 11, 3], r"token id 10 at prompt position 0 is outside .* \(2 such ids\)"),
        (list(range(9)), r"the prompt has 9 tokens, over the top rung 8"),
    ],
)
def test_prompt_checks(prompt: list[int], pattern: str) -> None:
    from ovspec.errors import BadRequestError
    from ovspec.runtime.decoding import check_prompt_ids

    with pytest.raises(BadRequestError, match=pattern):
        check_prompt_ids(prompt, vocab_tokens=10, top_tokens=8)
    check_prompt_ids(list(range(8)), vocab_tokens=10, top_tokens=8)  # fits: no error
    check_prompt_ids([10**6], vocab_tokens=None, top_tokens=8)  # no vocabulary to check
