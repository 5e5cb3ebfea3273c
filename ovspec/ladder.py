"""The ladder: a strictly increasing list of KV capacities, and rung selection.

A rung is a capacity in tokens (past positions a static graph holds). The ladder
parses and validates user text once; everything downstream gets a ``Ladder``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from ovspec.errors import LadderError, arg

DEFAULT_LADDER_TOKENS: tuple[int, ...] = (1024, 2048, 4096, 8192)
# The largest capacity (and token count) ovspec takes: 4M tokens, past every model's
# position limit today; a larger number is a typo, refused before any work (issue 29).
MAX_CAPACITY_TOKENS = 1 << 22


@dataclass(frozen=True)
class Ladder:
    """Strictly increasing positive capacities in tokens."""

    capacities_tokens: tuple[int, ...] = DEFAULT_LADDER_TOKENS

    def __post_init__(self) -> None:
        caps = self.capacities_tokens
        if not caps:
            raise LadderError(
                f"the ladder is empty; give at least one capacity, e.g. {arg('ladder', '1024')}"
            )
        for cap in caps:
            if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
                raise LadderError(f"ladder capacity {cap!r} is not a positive integer")
            if cap > MAX_CAPACITY_TOKENS:
                raise LadderError(
                    f"ladder capacity {cap:,} is over {MAX_CAPACITY_TOKENS:,} tokens "
                    f"(4096K), the most ovspec takes"
                )
        for low, high in itertools.pairwise(caps):
            if high <= low:
                raise LadderError(
                    f"ladder {','.join(map(str, caps))} is not strictly increasing "
                    f"({low} then {high}); list capacities smallest first"
                )

    @classmethod
    def parse(cls, text: str) -> Ladder:
        """Parse ``"1024,2048,4K,8k"`` (``K`` means x1024)."""
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise LadderError(f"malformed ladder {text!r}; expected e.g. 1024,2048,4096")
        caps: list[int] = []
        for part in parts:
            scale = 1
            digits = part
            if part[-1] in "kK":
                scale, digits = 1024, part[:-1]
            if not digits.isdigit():
                raise LadderError(f"ladder entry {part!r} is not a positive integer")
            caps.append(int(digits) * scale)
        return cls(tuple(caps))

    def __iter__(self) -> Iterator[int]:
        return iter(self.capacities_tokens)

    def __len__(self) -> int:
        return len(self.capacities_tokens)

    def __str__(self) -> str:
        return ",".join(str(c) for c in self.capacities_tokens)

    @property
    def top_tokens(self) -> int:
        return self.capacities_tokens[-1]

    def rung_for(self, tokens: int) -> int:
        """Smallest rung whose capacity holds ``tokens`` positions."""
        if tokens < 0:
            raise LadderError(f"token count {tokens} is negative")
        i = bisect.bisect_left(self.capacities_tokens, tokens)
        if i == len(self.capacities_tokens):
            raise LadderError(
                f"{tokens} tokens exceed the top rung {self.top_tokens}; "
                f"extend {arg('ladder')} or shorten the request"
            )
        return self.capacities_tokens[i]

    def successor(self, capacity_tokens: int) -> int | None:
        """The next rung after ``capacity_tokens``, or None at the top."""
        i = self.capacities_tokens.index(capacity_tokens)
        return self.capacities_tokens[i + 1] if i + 1 < len(self.capacities_tokens) else None

    def check_fits(self, max_position_embeddings: int | None) -> None:
        """Reject rungs beyond the model's position limit (None: no limit known)."""
        if max_position_embeddings is None:
            return
        for cap in self.capacities_tokens:
            if cap > max_position_embeddings:
                raise LadderError(
                    f"rung {cap} exceeds the model's max_position_embeddings "
                    f"{max_position_embeddings}; lower {arg('ladder')}"
                )
