"""Driving an OpenAI endpoint with a trace through the official ``openai`` client: each
request sent at its arrival once one of ``clients`` is free, streamed, each chunk's
arrival time kept; the server's /metrics sampled meanwhile (KV reserved over time)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from ovspec.bench.serve.samples import RequestSample
from ovspec.bench.serve.trace import TraceRequest

METRICS_PERIOD_S = 0.2
GAUGES = ("ovspec_kv_reserved_bytes", "ovspec_kv_capacity_tokens", "ovspec_running_sequences")


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # .../v1
    model: str
    api_key: str = "none"

    @property
    def metrics_url(self) -> str:
        return self.base_url.removesuffix("/v1") + "/metrics"


def drive(endpoint: Endpoint, trace: Sequence[TraceRequest], clients: int) -> dict[str, Any]:
    """The arm's raw record: per-request samples, KV samples ``[t, bytes, capacity,
    running]`` and the server's seconds spent growing its KV (boundary waits)."""
    return asyncio.run(_drive(endpoint, trace, clients))


async def _drive(endpoint: Endpoint, trace: Sequence[TraceRequest], clients: int) -> dict[str, Any]:
    api = openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=3600
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    slots = asyncio.Semaphore(clients)
    done = asyncio.Event()
    kv: list[list[float]] = []

    async def one(request: TraceRequest) -> RequestSample:
        await asyncio.sleep(max(0.0, request.at_s - (loop.time() - start)))
        async with slots:
            sent = loop.time() - start
            times: list[float] = []
            stream = await api.completions.create(
                model=endpoint.model,
                prompt=list(request.prompt_ids),
                max_tokens=request.max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    times.append(loop.time() - start)
            return RequestSample(request.at_s, sent, tuple(times))

    async def watch() -> float:
        growth_s = 0.0
        async with httpx.AsyncClient() as http:
            while not done.is_set():
                values = _scrape((await http.get(endpoint.metrics_url)).text)
                kv.append([loop.time() - start, *(values[name] for name in GAUGES)])
                growth_s = values["ovspec_kv_growth_seconds_total"]
                await asyncio.sleep(METRICS_PERIOD_S)
        return growth_s

    watcher = asyncio.create_task(watch())
    try:
        samples = await asyncio.gather(*(one(r) for r in trace))
    finally:
        done.set()
        growth_s = await watcher
        await api.close()
    return {"requests": [s.as_json() for s in samples], "kv": kv, "growth_s": growth_s}


def _scrape(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^(ovspec_\w+) (\S+)$", text, re.MULTILINE)}
