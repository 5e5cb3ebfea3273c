"""What one arm of the serving benchmark records: per request its arrival, send, and
each token's arrival time (raw, seconds from the run's start), and the server's KV
over time; the figures a page shows are computed from these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RequestSample:
    arrival_s: float
    sent_s: float
    token_s: tuple[float, ...]  # when each token (stream chunk) arrived

    def as_json(self) -> dict[str, Any]:
        return {"arrival_s": self.arrival_s, "sent_s": self.sent_s, "token_s": list(self.token_s)}


def throughput_tokens_per_s(requests: Sequence[Mapping[str, Any]]) -> float:
    """Generated tokens over the makespan (first arrival to last token)."""
    tokens = sum(len(r["token_s"]) for r in requests)
    end = max(r["token_s"][-1] for r in requests if r["token_s"])
    start = min(r["arrival_s"] for r in requests)
    return tokens / (end - start) if end > start else float("nan")


def first_token_s(requests: Sequence[Mapping[str, Any]]) -> list[float]:
    """Time to first token from arrival (queueing included: what a user waits)."""
    return [r["token_s"][0] - r["arrival_s"] for r in requests if r["token_s"]]


def inter_token_s(requests: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(d) for r in requests for d in np.diff(r["token_s"])]


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")
