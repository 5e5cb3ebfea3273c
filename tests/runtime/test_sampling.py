"""Sampling by distribution: the candidate distribution equals an independent reference on
the same logits, seeded draws fit it (chi-square) and replay, and openvino-genai's own
sampler draws from the same distribution on the same model."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import ovspec
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.decoding import decode
from ovspec.runtime.sampling import (
    GenerationConfig,
    TokenChooser,
    candidate_distribution,
    penalize_repetitions,
)
from ovspec.store.local import Store


def reference_distribution(
    logits: list[float], top_k: int, temperature: float, top_p: float
) -> dict[int, float]:
    """genai's transforms written out plainly: top-k, softmax(x / T), nucleus (> top_p)."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if 0 < top_k < len(order):
        order = order[:top_k]
    top = logits[order[0]]
    weights = [math.exp((logits[i] - top) / temperature) for i in order]
    total = sum(weights)
    probs = [w / total for w in weights]
    if top_p < 1.0:
        running, kept = 0.0, 0
        for p in probs:
            running += p
            kept += 1
            if running > top_p:
                break
        order, probs = order[:kept], probs[:kept]
        total = sum(probs)
        probs = [p / total for p in probs]
    return dict(zip(order, probs, strict=True))


def as_dict(ids: np.ndarray, probs: np.ndarray) -> dict[int, float]:
    return {int(i): float(p) for i, p in zip(ids, probs, strict=True)}


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.floats(-12, 12, width=32), min_size=2, max_size=40),
    top_k=st.integers(0, 45),
    temperature=st.floats(0.05, 4.0),
    top_p=st.floats(0.01, 1.0),
)
def test_candidates_equal_the_reference(
    logits: list[float], top_k: int, temperature: float, top_p: float
) -> None:
    config = GenerationConfig(do_sample=True, top_k=top_k, temperature=temperature, top_p=top_p)
    got = as_dict(*candidate_distribution(np.array(logits, dtype=np.float32), config))
    expected = reference_distribution(
        [float(np.float32(x)) for x in logits], top_k, temperature, top_p
    )
    assert got.keys() == expected.keys()
    for token, p in expected.items():
        assert got[token] == pytest.approx(p, rel=1e-9, abs=1e-12)


LOGITS = np.array([2.0, 1.5, 1.4, 0.3, -0.2, -1.0, 0.9, 3.1, -4.0, 0.0], dtype=np.float32)


def draw(config: GenerationConfig, logits: np.ndarray, n: int) -> np.ndarray:
    chooser = TokenChooser(config, [])
    return np.array([chooser(logits) for _ in range(n)])


def fit_p_value(tokens: np.ndarray, expected: dict[int, float]) -> float:
    ids = sorted(expected)
    counts = np.array([(tokens == i).sum() for i in ids])
    assert counts.sum() == tokens.size  # nothing outside the candidates was drawn
    probs = np.array([expected[i] for i in ids])
    return float(chisquare(counts, probs * tokens.size).pvalue)


@pytest.mark.parametrize(
    ("top_k", "temperature", "top_p"), [(0, 1.0, 1.0), (5, 0.7, 1.0), (0, 1.3, 0.8), (6, 2.0, 0.9)]
)
def test_seeded_draws_fit_the_reference(top_k: int, temperature: float, top_p: float) -> None:
    config = GenerationConfig(
        do_sample=True, top_k=top_k, temperature=temperature, top_p=top_p, rng_seed=11
    )
    tokens = draw(config, LOGITS, 20_000)
    expected = reference_distribution(LOGITS.tolist(), top_k, temperature, top_p)
    assert fit_p_value(tokens, expected) > 1e-3
    # The same seed replays the same draws; another seed does not.
    assert np.array_equal(tokens[:200], draw(config, LOGITS, 200))
    other = GenerationConfig(
        do_sample=True, top_k=top_k, temperature=temperature, top_p=top_p, rng_seed=12
    )
    assert not np.array_equal(tokens[:200], draw(other, LOGITS, 200))


def test_the_fit_check_can_fail() -> None:
    # Draws at temperature 1.0 tested against the temperature-0.5 distribution.
    tokens = draw(GenerationConfig(do_sample=True, rng_seed=1), LOGITS, 20_000)
    assert fit_p_value(tokens, reference_distribution(LOGITS.tolist(), 0, 0.5, 1.0)) < 1e-6


def test_greedy_is_argmax_and_ignores_sampling_settings() -> None:
    rng = np.random.default_rng(0)
    chooser = TokenChooser(GenerationConfig(temperature=0.1, top_k=3, top_p=0.2), [1, 2])
    for _ in range(50):
        logits = rng.standard_normal(100).astype(np.float32)
        assert chooser(logits) == int(np.argmax(logits))


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = np.array([2.0, -2.0, 1.0, -1.0, 0.0], dtype=np.float32)
    out = penalize_repetitions(logits, [0, 1, 1, 4], 2.0)
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0, -1.0, 0.0])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 1.0, -1.0, 0.0])  # a copy
    # The chooser counts the prompt and what it generated: a repeated winner is pushed down.
    chooser = TokenChooser(GenerationConfig(repetition_penalty=4.0), prompt_ids=[0])
    logits = np.array([3.0, 1.0, 0.9], dtype=np.float32)
    assert chooser(logits) == 1  # 3/4 < 1
    assert chooser(logits) == 2  # 3/4 and 1/4 < 0.9 now


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens 0"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
        ({"do_sample": True, "top_p": 0.0}, "top_p must be in"),
        ({"do_sample": True, "top_p": 1.5}, "top_p must be in"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"stop_token_ids": frozenset({-3})}, "non-negative"),
        ({"stop_strings": ("",)}, "must not be empty"),
        ({"rng_seed": -1}, "rng_seed"),
    ],
)
def test_bad_settings_are_refused(settings_: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        GenerationConfig(**settings_)  # type: ignore[arg-type]


def test_ignore_eos_turns_off_every_stop_id() -> None:
    config = GenerationConfig(eos_token_ids=frozenset({0}), stop_token_ids=frozenset({5}))
    assert config.stop_ids == {0, 5}
    assert GenerationConfig(ignore_eos=True, stop_token_ids=frozenset({5})).stop_ids == set()


# -- on a model, against openvino-genai ----------------------------------------------

PROMPT = [17, 40, 41, 42, 9, 77, 100]


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ovspec.testing.gguf import write_gguf

    return write_gguf("qwen2", tmp_path_factory.mktemp("s") / "m.gguf", "Q8_0", seed=1)


def genai_config(**settings_: object) -> openvino_genai.GenerationConfig:
    cfg = openvino_genai.GenerationConfig()
    cfg.apply_chat_template = False
    cfg.ignore_eos = True
    for name, value in settings_.items():
        setattr(cfg, name, value)
    return cfg


def tokenized(prompt: list[int]) -> openvino_genai.TokenizedInputs:
    ids = np.array(prompt, dtype=np.int64)[None]
    return openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))


@pytest.mark.parametrize(
    ("top_k", "temperature", "top_p"), [(5, 1.5, 1.0), (0, 0.8, 0.7), (12, 1.2, 0.85)]
)
def test_genai_samples_the_same_distribution(
    qwen2_gguf: Path, store: Store, top_k: int, temperature: float, top_p: float
) -> None:
    with ovspec.open(
        qwen2_gguf, ladder="32", properties=EXACT_CPU_PROPERTIES, store=store
    ) as loader:
        first = decode(loader, PROMPT, forced_ids=[], keep_logits=lambda step, _: step == 0)
    logits = first.logits[0]
    config = GenerationConfig(do_sample=True, top_k=top_k, temperature=temperature, top_p=top_p)
    expected = as_dict(*candidate_distribution(logits, config))
    assert len(expected) >= 3
    pipe = openvino_genai.LLMPipeline(str(qwen2_gguf), "CPU", **EXACT_CPU_PROPERTIES)
    draws = 3000
    genai_tokens = np.array(
        [
            int(
                pipe.generate(
                    tokenized(PROMPT),
                    genai_config(
                        max_new_tokens=1,
                        do_sample=True,
                        top_k=top_k,
                        temperature=temperature,
                        top_p=top_p,
                        rng_seed=seed,
                    ),
                ).tokens[0][0]
            )
            for seed in range(draws)
        ]
    )
    assert fit_p_value(genai_tokens, expected) > 1e-3
    ovspec_tokens = np.array(
        [TokenChooser(replace(config, rng_seed=s), PROMPT)(logits) for s in range(draws)]
    )
    assert fit_p_value(ovspec_tokens, expected) > 1e-3


def test_repetition_penalty_matches_genai_greedy(qwen2_gguf: Path, store: Store) -> None:
    from ovspec.runtime.generation import generate

    pipe = openvino_genai.LLMPipeline(str(qwen2_gguf), "CPU", **EXACT_CPU_PROPERTIES)
    cfg = genai_config(max_new_tokens=40, do_sample=False, repetition_penalty=1.6)
    expected = [int(t) for t in pipe.generate(tokenized(PROMPT), cfg).tokens[0]]
    plain = [
        int(t) for t in pipe.generate(tokenized(PROMPT), genai_config(max_new_tokens=40)).tokens[0]
    ]
    assert expected != plain  # the penalty changes the run
    with ovspec.open(
        qwen2_gguf, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=store
    ) as loader:
        got = generate(
            loader,
            PROMPT,
            GenerationConfig(max_new_tokens=40, ignore_eos=True, repetition_penalty=1.6),
        )
    assert list(got.token_ids) == expected


def test_seeded_runs_replay_through_a_ladder(tiny_dir: Path, store: Store) -> None:
    from ovspec.runtime.generation import generate

    def run(seed: int) -> tuple[int, ...]:
        config = GenerationConfig(
            max_new_tokens=50, ignore_eos=True, do_sample=True, top_k=40, rng_seed=seed
        )
        with ovspec.open(
            tiny_dir, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=store
        ) as loader:
            return generate(loader, [5, 6, 7, 8], config).token_ids

    first = run(3)
    assert len(first) == 50
    assert run(3) == first
    assert run(4) != first
