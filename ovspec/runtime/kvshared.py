"""The shared-max KV layout: one buffer at the top capacity, each rung a view into it.

As upstream's pyramid does: the top rung is reserved once, from the start, and a
boundary re-strides the live KV inside the one buffer (no allocation). The B1
protocol's layout.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import openvino as ov

from ovspec.errors import LadderError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime.kvcache import KVCache, KVLayout, Migration, Prefault, np_dtype, seq_slice


class SharedMaxKV(KVCache):
    """One buffer at the top capacity, reserved from the start; each rung binds a view.

    ``dense_views`` (the default): rung C's past is the first C-rung's worth of the flat
    buffer, a dense array, and a boundary re-strides the live KV in place (no new
    allocation; the bytes move up inside the one buffer, the free slots are zeroed).
    Strided views (each head's rows a top rung apart) cost the CPU plugin a slower step
    on every call and cannot be warmed up (OpenVINO 2026.4 corrupts its heap when a
    compiled model runs dense inputs and then strided ones); they are kept for the
    measurement (docs/benchmarks/bench.md). Any model and ladder; never a default: it
    reserves the top rung from the start.
    """

    layout: ClassVar[KVLayout] = KVLayout.SHARED_MAX
    chosen_by_default: ClassVar[bool] = False

    @classmethod
    def create(
        cls,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        ladder: Ladder | None = None,
        prefault: Prefault | None = None,
    ) -> SharedMaxKV:
        return cls(roles, capacity_tokens, max_capacity_tokens)

    def __init__(
        self,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        dense_views: bool = True,
    ) -> None:
        if capacity_tokens > max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {max_capacity_tokens}"
            )
        super().__init__(roles, capacity_tokens)
        self.max_capacity_tokens = max_capacity_tokens
        self.dense_views = dense_views
        self._full = {
            role.past_input: np.zeros(role.shape(1, max_capacity_tokens), dtype=np_dtype(role))
            for role in roles.kv
        }
        # The parent tensors must outlive every ROI view made from them.
        self._parents = {name: ov.Tensor(a, shared_memory=True) for name, a in self._full.items()}

    def _dense(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        flat = self._full[name].reshape(-1)
        return flat[: int(np.prod(shape))].reshape(shape)

    def tensors(self) -> dict[str, ov.Tensor]:
        if self.dense_views:
            return {
                name: ov.Tensor(array, shared_memory=True) for name, array in self.arrays().items()
            }
        views = {}
        for role in self.roles.kv:
            end = role.shape(1, self.capacity_tokens)
            views[role.past_input] = ov.Tensor(self._parents[role.past_input], [0] * len(end), end)
        return views

    def arrays(self) -> dict[str, np.ndarray]:
        if self.dense_views:
            return {
                role.past_input: self._dense(
                    role.past_input, tuple(role.shape(1, self.capacity_tokens))
                )
                for role in self.roles.kv
            }
        return {
            role.past_input: self._full[role.past_input][seq_slice(role, 0, self.capacity_tokens)]
            for role in self.roles.kv
        }

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._full.values())

    def spans(self) -> list[tuple[int, int]]:
        return [(a.ctypes.data, a.nbytes) for a in self._full.values()]

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        if capacity_tokens > self.max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {self.max_capacity_tokens}"
            )
        start = time.perf_counter()
        moved = 0
        live = self.live_tokens
        if self.dense_views:
            for role in self.roles.kv:
                old = self._dense(role.past_input, tuple(role.shape(1, self.capacity_tokens)))
                new = self._dense(role.past_input, tuple(role.shape(1, capacity_tokens)))
                # The views overlap; numpy copies through a buffer when they do.
                new[seq_slice(role, 0, live)] = old[seq_slice(role, 0, live)]
                new[seq_slice(role, live, capacity_tokens)] = 0  # stale rows: zeros, as new
                moved += role.bytes_per_token * live
        seconds = time.perf_counter() - start
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=moved,
            allocated_bytes=0,
            seconds=seconds,
            peak_reserved_bytes=self.reserved_bytes,
            peak_physical_bytes=self._peak(self.spans()),
            copy_seconds=seconds,
        )
        self.capacity_tokens = capacity_tokens
        return migration
