"""How many builds run at once (``Lanes``: before the prompt and while decoding) and when
each queued build starts and ends on them (``BuildLanes``), for the ``auto`` policy's
simulation and re-plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ovspec.errors import BadRequestError


@dataclass(frozen=True)
class Lanes:
    """How many builds run at once: before the prompt nothing decodes, so builds may use
    every core (``foreground``); while decoding, ``background`` at most (under the
    device/host split the host builds one blob at a time: 1)."""

    foreground: int = 1
    background: int = 1

    def __post_init__(self) -> None:
        if self.foreground < 1 or self.background < 1:
            raise BadRequestError(f"build lanes must be at least 1, got {self}")

    @classmethod
    def for_cores(cls, usable_cores: int, split: bool) -> Lanes:
        """Split: one host build at a time. Shared cores: every core before the prompt
        (a compile keeps about one busy), all but the decode's while decoding."""
        if split:
            return cls(1, 1)
        return cls(max(1, min(2, usable_cores)), max(1, usable_cores - 1))


class BuildLanes:
    """Build lanes as the times each is next free; a build takes the earliest."""

    def __init__(self, free_s: Sequence[float]) -> None:
        self.free_s = list(free_s)

    def run(self, release_s: float, seconds: float) -> tuple[float, float]:
        lane = min(range(len(self.free_s)), key=lambda i: self.free_s[i])
        start_s = max(release_s, self.free_s[lane])
        self.free_s[lane] = start_s + seconds
        return start_s, start_s + seconds
