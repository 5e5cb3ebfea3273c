"""One generation's speed in openvino-genai's ``PerfMetrics`` terms, so a figure reads the
same as genai's: load time, TTFT, TPOT and throughput, under genai's definitions.

genai (src/cpp/src/perf_metrics.cpp): TTFT runs from the start of ``generate`` to the
first token, the model being compiled at load (``load_time``); TPOT is the mean gap
between consecutive tokens after the first; throughput is 1000 / TPOT tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ovspec.runtime.decoding import DecodeResult


@dataclass(frozen=True)
class PerfMetrics:
    """genai's quantities for one sequence. ``load_time_ms``: the loader opened -> the
    prompt's graph ready (compiled or loaded), which genai spends before ``generate``;
    ``ttft_ms``: from then to the first token (the prompt's prefill); ``tpot_ms``: the
    decode after the first token over the tokens after it (None with fewer than two)."""

    num_input_tokens: int
    num_generated_tokens: int
    load_time_ms: float
    ttft_ms: float
    tpot_ms: float | None

    @property
    def throughput_tokens_per_s(self) -> float | None:
        return 1000.0 / self.tpot_ms if self.tpot_ms else None

    @classmethod
    def of(cls, result: DecodeResult) -> PerfMetrics:
        # Every token the model produced counts, including any a stop string trimmed.
        generated = len(result.token_ids)
        decode_ms = (result.finished_s - result.first_token_s) * 1000.0
        return cls(
            num_input_tokens=result.prompt_tokens,
            num_generated_tokens=generated,
            load_time_ms=result.ready_s * 1000.0,
            ttft_ms=(result.first_token_s - result.ready_s) * 1000.0,
            tpot_ms=decode_ms / (generated - 1) if generated > 1 else None,
        )

    def to_json(self) -> dict[str, object]:
        throughput = self.throughput_tokens_per_s
        return {
            "num_input_tokens": self.num_input_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "load_time_ms": round(self.load_time_ms, 3),
            "ttft_ms": round(self.ttft_ms, 3),
            "tpot_ms": None if self.tpot_ms is None else round(self.tpot_ms, 3),
            "throughput_tokens_per_s": None if throughput is None else round(throughput, 3),
        }

    def describe(self) -> str:
        """The human summary's speed: what a user compares with genai's figures."""
        load = f"model ready in {self.load_time_ms / 1000:.2f} s"
        ttft = f"TTFT {self.ttft_ms:.0f} ms"
        if self.tpot_ms is None:
            return f"{load}; {ttft}"
        rate = self.throughput_tokens_per_s or 0.0
        return f"{load}; {ttft}; TPOT {self.tpot_ms:.1f} ms ({rate:.1f} tokens/s)"
