"""The server's Prometheus metrics: read from the engine at each scrape (queue, running
sequences, the KV rung in use and bytes reserved, tokens and tokens/s, pool growths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ovspec.serve.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    """One scrape, one ``EngineStats``: every metric from the same moment."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = (
            ("ovspec_queue_requests", "Requests waiting for a slot", s.queued),
            ("ovspec_running_sequences", "Sequences in the batch", s.running),
            ("ovspec_kv_capacity_tokens", "The KV pool's reserved rung", s.capacity_tokens),
            ("ovspec_kv_reserved_bytes", "Bytes reserved for the KV pool", s.reserved_bytes),
            ("ovspec_tokens_per_second", "Generated tokens per second (10 s)", s.tokens_per_s),
        )
        for name, text, value in gauges:
            yield GaugeMetricFamily(name, text, value=value)
        counters = (
            ("ovspec_generated_tokens", "Tokens generated", s.generated_tokens),
            ("ovspec_batch_steps", "Batched infer calls", s.steps),
            ("ovspec_kv_growths", "KV pool boundaries crossed", s.growths),
            ("ovspec_kv_growth_seconds", "Seconds spent growing the KV pool", s.growth_s),
            ("ovspec_cancelled_sequences", "Sequences ended by a cancel", s.cancelled),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(name, text, value=value)


def metrics_text(stats: Callable[[], EngineStats]) -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(stats))
    return generate_latest(registry)
