"""Records every benchmark shares: the spread of a repeated measurement, the environment
a figure was measured in, and the folder benchmarks write their models to.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODELS_DIR = Path(tempfile.gettempdir()) / "ovspec-bench-models"


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements of one quantity (seconds or a ratio)."""

    n: int
    median: float
    low: float
    high: float
    samples: tuple[float, ...]  # in measurement order (repeat 1 first)

    def __post_init__(self) -> None:
        if self.n < 1 or self.n != len(self.samples) or not self.low <= self.median <= self.high:
            raise ValueError(f"inconsistent spread {self}")

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise ValueError("a spread needs at least one sample")
        return cls(
            len(samples), statistics.median(samples), min(samples), max(samples), tuple(samples)
        )

    def text(self, digits: int = 3) -> str:
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}–{self.high:.{digits}f})"


@dataclass(frozen=True)
class Environment:
    """Where the figures were measured; a figure is never read without it."""

    date_utc: str
    cpu_model: str
    logical_cores: int
    usable_cores: int
    memory_bytes: int
    os: str
    python: str
    openvino: str
    ovspec: str
    git_commit: str
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
