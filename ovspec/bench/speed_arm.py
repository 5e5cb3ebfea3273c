"""One run of the speed benchmark in this fresh process:
``python -m ovspec.bench.speed_arm REQUEST.json SPAWN_TIME``.

Owns the arms (openvino-genai's ``LLMPipeline``; ovspec's loader in a given policy and
load mode) and what a run records: the time of every generated token since the
parent spawned this process, the token ids, the high-water RSS (VmHWM) and the peak
PSS and private (RssAnon) memory sampled every 50 ms. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "


@dataclass(frozen=True)
class ArmRequest:
    arm: str  # "genai" or "ovspec"
    model_dir: str
    prompt_ids: tuple[int, ...]
    new_tokens: int
    properties: dict[str, str]
    ladder: str = ""
    store_dir: str = ""
    policy: str = "one_ahead"
    load_mode: str = ""  # "" = the device's default
    prefill_chunk_tokens: int = 128

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArmRequest:
        return cls(**{**data, "prompt_ids": tuple(data["prompt_ids"])})


class MemorySampler(threading.Thread):
    """Peak PSS and RssAnon of this process. VmHWM counts a shared file page once per
    mapping (a weightless import maps the .bin again); PSS counts it once."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_pss_mib = 0.0
        self.peak_anon_mib = 0.0
        self._stop = threading.Event()

    def sample(self) -> None:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    self.peak_pss_mib = max(self.peak_pss_mib, int(line.split()[1]) / 1024)
        self.peak_anon_mib = max(self.peak_anon_mib, _status_mib("RssAnon"))

    def run(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self.sample()


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _genai(request: ArmRequest, on_token: Any) -> dict[str, Any]:
    import numpy as np
    import openvino as ov
    import openvino_genai

    pipe = openvino_genai.LLMPipeline(request.model_dir, "CPU", **request.properties)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = request.new_tokens
    config.ignore_eos = True
    config.do_sample = False
    config.apply_chat_template = False
    ids = np.array(request.prompt_ids, dtype=np.int64)[None]

    class Ids(openvino_genai.StreamerBase):  # type: ignore[misc]
        """Token ids as they come (the built-in models have no detokenizer)."""

        def write(self, token: Any) -> Any:
            for t in token if isinstance(token, list) else [token]:
                on_token(int(t))
            return openvino_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    pipe.generate(inputs, config, streamer=Ids())
    return {}


def _ovspec(request: ArmRequest, on_token: Any) -> dict[str, Any]:
    import ovspec.runtime.decoding as runtime
    from ovspec.store.local import Store

    store = Store(Path(request.store_dir))
    try:
        with runtime.open(
            request.model_dir,
            ladder=request.ladder,
            properties=request.properties,
            store=store,
            policy=request.policy,
            prefill_chunk_tokens=request.prefill_chunk_tokens,
            load_mode=request.load_mode or None,
        ) as loader:
            result = runtime.decode(
                loader, request.prompt_ids, max_new_tokens=request.new_tokens, on_token=on_token
            )
    finally:
        store.close()
    return {
        "rungs": list(result.rungs),
        "boundary_wait_s": [b.program_wait_s for b in result.boundaries],
        "loads": [
            {"spec": e.spec, "kind": e.kind.value, "at_s": e.at_s, "seconds": e.seconds}
            for e in result.events
            if e.kind.value in ("compiled", "store_hit", "loaded", "wait", "released")
        ],
    }


def run(request: ArmRequest, spawn_s: float) -> dict[str, Any]:
    sampler = MemorySampler()
    sampler.start()
    times: list[float] = []
    tokens: list[int] = []

    def on_token(token: int) -> None:
        times.append(round(time.time() - spawn_s, 5))  # 10 us: well under a step
        tokens.append(token)

    if request.arm == "genai":
        extra = _genai(request, on_token)
    elif request.arm == "ovspec":
        extra = _ovspec(request, on_token)
    else:
        raise SystemExit(f"unknown arm {request.arm!r}")
    done_s = time.time() - spawn_s
    sampler.stop()
    return {
        "token_s": times,
        "token_ids": tokens,
        "done_s": done_s,
        "vm_hwm_mib": _status_mib("VmHWM"),
        "peak_pss_mib": sampler.peak_pss_mib,
        "peak_anon_mib": sampler.peak_anon_mib,
        **extra,
    }


def main(argv: list[str]) -> None:
    request = ArmRequest.from_json(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    result = run(request, float(argv[1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
