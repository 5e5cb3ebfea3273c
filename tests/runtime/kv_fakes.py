"""Synthetic KV roles and a writer that keeps a dense reference of what it wrote, shared
by the KV layout tests (no model, no OpenVINO graph)."""

from __future__ import annotations

import numpy as np
import openvino as ov

from ovspec.ir.roles import KVKind, KVRole, ModelRoles
from ovspec.runtime.kvcache import KVCache, seq_slice


def make_roles(
    layers: int = 2, heads: int = 2, head_dim: int = 64, seq_axis: int = 2
) -> ModelRoles:
    """[1, heads, C, head_dim] f32 per K and V of each layer (seq_axis 1: [1, C, heads, D])."""
    template = (0, heads, 0, head_dim) if seq_axis == 2 else (0, 0, heads, head_dim)
    kv = tuple(
        KVRole(
            layer=i // 2,
            kind=KVKind.KEY if i % 2 == 0 else KVKind.VALUE,
            past_input=f"past.{i}",
            present_output=f"present.{i}",
            seq_axis=seq_axis,
            shape_template=template,
            element_type=ov.Type.f32,
        )
        for i in range(2 * layers)
    )
    return ModelRoles("input_ids", "attention_mask", "position_ids", "logits", kv)


class Writer:
    """Writes random tokens into a KV cache and keeps a dense copy of everything written."""

    def __init__(self, roles: ModelRoles, top_tokens: int, seed: int = 0) -> None:
        self.roles = roles
        self.rng = np.random.default_rng(seed)
        self.reference = {
            r.past_input: np.zeros(r.shape(1, top_tokens), np.float32) for r in roles.kv
        }

    def write(self, kv: KVCache, count: int) -> None:
        start = kv.live_tokens
        present = {}
        for r in self.roles.kv:
            new = self.rng.standard_normal(r.shape(1, count)).astype(np.float32)
            present[r.present_output] = new
            self.reference[r.past_input][seq_slice(r, start, start + count)] = new
        kv.write(present, count)

    def fill_to_capacity(self, kv: KVCache) -> None:
        self.write(kv, kv.capacity_tokens - kv.live_tokens)

    def matches(self, kv: KVCache) -> bool:
        """Every slot of the current capacity equals the reference (unwritten ones: 0)."""
        arrays = kv.arrays()
        return all(
            np.array_equal(
                arrays[r.past_input],
                self.reference[r.past_input][seq_slice(r, 0, kv.capacity_tokens)],
            )
            for r in self.roles.kv
        )
