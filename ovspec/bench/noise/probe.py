"""One fresh process of the noise-floor probe: a static decode graph compiled by plain
OpenVINO on one pinned core and stepped in a tight loop, beside a compute-bound numpy
control, each step's seconds reported (``python -m ovspec.bench.noise.probe REQUEST``).
No ovspec runtime code runs in the timed loop: what moves is the machine and OpenVINO.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CONTROL_SIDE = 256  # the control multiplies two f32 matrices this wide (fits in L2)


@dataclass(frozen=True)
class ProbeRequest:
    model_dir: str
    capacity_tokens: int
    warmup_steps: int
    steps: int
    control_steps: int
    core: int
    properties: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run(request: ProbeRequest) -> dict[str, Any]:
    os.sched_setaffinity(0, {request.core})  # before OpenVINO starts its threads
    import numpy as np
    import openvino as ov

    from ovspec.ir.model_dir import ModelDir
    from ovspec.ir.specialize import Specialization, prepare, read_ir

    model_dir = ModelDir.open(Path(request.model_dir))
    graph = prepare(read_ir(model_dir.xml_path)).specialize(
        Specialization.decode(request.capacity_tokens)
    )
    compiled = ov.Core().compile_model(graph, "CPU", request.properties)
    infer = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    for port in compiled.inputs:
        tensor = ov.Tensor(port.get_element_type(), list(port.get_partial_shape().to_shape()))
        if tensor.data.dtype.kind == "f":
            tensor.data[...] = rng.standard_normal(tensor.shape) * 0.01
        else:
            tensor.data[...] = 0
        infer.set_tensor(port, tensor)
    step_s = []
    for i in range(request.warmup_steps + request.steps):
        began = time.perf_counter()
        infer.infer()
        if i >= request.warmup_steps:
            step_s.append(time.perf_counter() - began)
    matrix = rng.standard_normal((CONTROL_SIDE, CONTROL_SIDE)).astype(np.float32)
    control_s = []
    for _ in range(request.control_steps):
        began = time.perf_counter()
        matrix @ matrix
        control_s.append(time.perf_counter() - began)
    return {
        "step_s": [round(s, 7) for s in step_s],
        "control_s": [round(s, 7) for s in control_s],
        "inference_num_threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
    }


def main(argv: list[str]) -> int:
    request_path = Path(argv[0])
    request = ProbeRequest(**json.loads(request_path.read_text()))
    result = run(request)
    request_path.with_suffix(".out.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
