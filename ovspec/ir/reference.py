"""The original dynamic stateful model run as OpenVINO runs it: the control for equivalence.

Feeds a prompt, then one token per step, through the exported stateful IR with its
own variables; returns per-step logits so static specializations can be compared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov

from ovspec.errors import ModelError

# DESIGN.md §9: CPU's defaults quantize the stateful model's KV cache (u8) and its
# activations; the static graphs take f32 KV inputs. Exact comparisons pin both.
EXACT_CPU_PROPERTIES: dict[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
}


class StatefulRunner:
    """Teacher-forced or greedy runs of a stateful LLM IR (batch 1)."""

    def __init__(self, model: ov.Model, device: str, properties: dict[str, str]) -> None:
        names = {i.get_any_name() for i in model.inputs}
        if not model.get_variables():
            raise ModelError("the reference runner needs the stateful IR (it has no variables)")
        self._has_positions = "position_ids" in names
        self._has_beam = "beam_idx" in names
        self._request = ov.Core().compile_model(model, device, properties).create_infer_request()

    def _infer(self, ids: Sequence[int], start: int) -> np.ndarray:
        n = len(ids)
        feed: dict[str, np.ndarray] = {
            "input_ids": np.asarray(ids, dtype=np.int64)[None],
            "attention_mask": np.ones((1, start + n), dtype=np.int64),
        }
        if self._has_positions:
            feed["position_ids"] = np.arange(start, start + n, dtype=np.int64)[None]
        if self._has_beam:
            feed["beam_idx"] = np.zeros(1, dtype=np.int32)
        out = self._request.infer(feed)
        return np.array(out["logits"][0], copy=True)

    def teacher_forced(self, prompt_ids: Sequence[int], forced_ids: Sequence[int]) -> np.ndarray:
        """Logits after the prompt, then after each forced token: ``[1 + len(forced), vocab]``."""
        self._request.reset_state()
        rows = [self._infer(prompt_ids, 0)[-1]]
        position = len(prompt_ids)
        for token in forced_ids:
            rows.append(self._infer([token], position)[-1])
            position += 1
        return np.stack(rows)

    def greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        self._request.reset_state()
        logits = self._infer(prompt_ids, 0)[-1]
        position = len(prompt_ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) == max_new_tokens:
                break
            logits = self._infer([token], position)[-1]
            position += 1
        return out
