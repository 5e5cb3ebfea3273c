"""openvino-genai's ``ContinuousBatchingPipeline`` driven by the same trace, in its own
process: a request is added at its arrival once one of ``clients`` is free, the pipeline
steps while any runs, and each token's time is kept. Reads a JSON job on stdin and
writes the arm's record to the path the job names."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np


def run(job: dict[str, Any]) -> dict[str, Any]:
    import openvino as ov
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = int(job["cache_gb"])
    pipe = genai.ContinuousBatchingPipeline(job["model_dir"], scheduler, "CPU")
    trace = job["trace"]
    pending = list(range(len(trace)))
    running: dict[int, Any] = {}
    sent: dict[int, float] = {}
    tokens: dict[int, list[float]] = {i: [] for i in pending}
    start = time.perf_counter()
    while pending or running:
        now = time.perf_counter() - start
        while pending and len(running) < job["clients"] and trace[pending[0]]["at_s"] <= now:
            index = pending.pop(0)
            config = genai.GenerationConfig()
            config.max_new_tokens = trace[index]["max_tokens"]
            config.ignore_eos = True
            ids = ov.Tensor(np.array([trace[index]["prompt_ids"]], np.int64))
            running[index] = pipe.add_request(index, ids, config)
            sent[index] = now
        if not running:
            time.sleep(max(0.0, trace[pending[0]]["at_s"] - now))
            continue
        pipe.step()
        now = time.perf_counter() - start
        for index, handle in list(running.items()):
            if handle.can_read():
                for output in handle.read().values():
                    tokens[index].extend([now] * len(output.generated_ids))
            if handle.get_status() != genai.GenerationStatus.RUNNING:
                del running[index]
    requests = [
        {"arrival_s": r["at_s"], "sent_s": sent[i], "token_s": tokens[i]}
        for i, r in enumerate(trace)
    ]
    return {"requests": requests, "kv": [], "growth_s": 0.0}


if __name__ == "__main__":
    job = json.load(sys.stdin)
    with open(job["out"], "w", encoding="utf-8") as out:
        json.dump(run(job), out)
