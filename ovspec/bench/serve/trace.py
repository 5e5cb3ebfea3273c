"""A seeded request trace: arrival times (Poisson), prompt token ids and output lengths,
the same for every arm of a run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovspec.errors import BadRequestError


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # arrival, seconds after the run starts
    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class TraceSpec:
    """How a trace is drawn: ``requests`` arrivals at ``rate_per_s`` on average, prompt
    and output lengths uniform in their ranges, ids in ``[3, vocab_tokens)``."""

    requests: int
    rate_per_s: float
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    seed: int = 0

    def __post_init__(self) -> None:
        ranges = (self.prompt_tokens, self.output_tokens)
        if self.requests < 1 or self.rate_per_s <= 0 or any(not 1 <= a <= b for a, b in ranges):
            raise BadRequestError(f"an empty or inverted trace: {self}")

    def draw(self, vocab_tokens: int) -> tuple[TraceRequest, ...]:
        rng = np.random.default_rng(self.seed)
        gaps = rng.exponential(1.0 / self.rate_per_s, self.requests)
        arrivals = np.cumsum(gaps) - gaps[0]  # the first arrives at 0
        out = []
        for at in arrivals:
            prompt = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
            ids = tuple(int(t) for t in rng.integers(3, vocab_tokens, prompt))
            tokens = int(rng.integers(self.output_tokens[0], self.output_tokens[1] + 1))
            out.append(TraceRequest(float(at), ids, tokens))
        return tuple(out)
