"""Choosing the next token: openvino-genai's ``GenerationConfig`` meanings, in numpy.

Owns the generation settings (validated as genai validates them) and the token chooser:
greedy is ``argmax`` of the raw logits, bit for bit what ``decode`` did before; with
``do_sample`` the logits go through repetition penalty -> top-k -> softmax(logits / T)
-> top-p, in genai's order (src/cpp/src/sampling/logit_processor.hpp), and one token is
drawn from the result with a generator seeded by ``rng_seed``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ovspec.errors import BadRequestError


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop; field names and meanings follow openvino-genai.

    ``eos_token_ids`` come from the model (config files or tokenizer) and stop like
    ``stop_token_ids``; ``ignore_eos`` turns both off (as in genai), stop strings stay on.
    ``top_k`` 0 means no top-k filter. ``rng_seed`` makes ``do_sample`` reproducible.
    """

    max_new_tokens: int = 64
    ignore_eos: bool = False
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    rng_seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise BadRequestError(f"max_new_tokens {self.max_new_tokens} must be at least 1")
        for name, ids in (("eos", self.eos_token_ids), ("stop", self.stop_token_ids)):
            bad = sorted(i for i in ids if i < 0)
            if bad:
                raise BadRequestError(f"{name} token ids must be non-negative, got {bad[0]}")
        if any(not s for s in self.stop_strings):
            raise BadRequestError("a stop string must not be empty")
        if not self.repetition_penalty > 0:
            raise BadRequestError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}; 1 turns it off"
            )
        if self.top_k < 0:
            raise BadRequestError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if self.rng_seed < 0:
            raise BadRequestError(f"rng_seed must be >= 0, got {self.rng_seed}")
        if self.do_sample:
            if not 0 < self.top_p <= 1:
                raise BadRequestError(f"with do_sample, top_p must be in (0, 1], got {self.top_p}")
            if not self.temperature > 0:
                raise BadRequestError(
                    f"with do_sample, temperature must be > 0, got {self.temperature}"
                )

    @property
    def is_greedy(self) -> bool:
        return not self.do_sample

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end generation (none with ``ignore_eos``)."""
        return frozenset() if self.ignore_eos else self.eos_token_ids | self.stop_token_ids


def penalize_repetitions(logits: np.ndarray, seen_ids: Iterable[int], penalty: float) -> np.ndarray:
    """genai's repetition penalty over the prompt's and the generated ids, each once:
    a logit >= 0 is divided by ``penalty``, a negative one multiplied. Returns a copy."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0:
        return out
    ids = np.fromiter(set(seen_ids), dtype=np.int64)
    values = out[ids]
    out[ids] = np.where(values >= 0, values / np.float32(penalty), values * np.float32(penalty))
    return out


def candidate_distribution(
    logits: np.ndarray, config: GenerationConfig
) -> tuple[np.ndarray, np.ndarray]:
    """``(token ids, probabilities)`` a sampled token is drawn from: top-k, then softmax at
    the temperature, then the smallest prefix by probability whose sum exceeds top_p.
    Probabilities sum to 1; ids are ordered by descending probability (ties by id)."""
    scores = np.asarray(logits, dtype=np.float64).reshape(-1)
    order = np.lexsort((np.arange(scores.size), -scores))  # descending, ties by lower id
    if 0 < config.top_k < scores.size:
        order = order[: config.top_k]
    kept = scores[order]
    weights = np.exp((kept - kept[0]) / config.temperature)
    probs = weights / weights.sum()
    if config.top_p < 1.0:
        # Keep tokens up to and including the first whose running sum exceeds top_p.
        nucleus = int(np.searchsorted(np.cumsum(probs), config.top_p, side="right")) + 1
        order, probs = order[:nucleus], probs[:nucleus]
        probs = probs / probs.sum()
    return order, probs


class TokenChooser:
    """Picks each next token for one sequence under ``config`` (it remembers what it chose:
    the repetition penalty counts the prompt and every generated token)."""

    def __init__(self, config: GenerationConfig, prompt_ids: Iterable[int]) -> None:
        self.config = config
        self._seen: set[int] = {int(i) for i in prompt_ids}
        self._rng = np.random.Generator(np.random.PCG64(config.rng_seed))

    def __call__(self, logits: np.ndarray) -> int:
        config = self.config
        scores = logits
        if config.repetition_penalty != 1.0:
            scores = penalize_repetitions(logits, self._seen, config.repetition_penalty)
        if config.is_greedy:
            token = int(np.argmax(scores))
        else:
            ids, probs = candidate_distribution(scores, config)
            # One uniform draw per token: the same seed replays the same sequence.
            index = int(np.searchsorted(np.cumsum(probs), self._rng.random(), side="right"))
            token = int(ids[min(index, ids.size - 1)])
        self._seen.add(token)
        return token
