"""KV memory for one sequence: buffers per past input, growth at boundaries, in-place writes.

Two layouts. ``CopyAndGrowKV`` sizes buffers to the current rung and copies the live
prefix into new buffers at a boundary. ``SharedMaxKV`` reserves the top rung once and
gives smaller rungs strided views (OpenVINO ROI tensors) into it, as upstream's
pyramid does. Both hand OpenVINO tensors that share memory with their arrays, so a
decode step never copies the cache.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np
import openvino as ov

from ovspec.errors import LadderError
from ovspec.ir.roles import KVRole, ModelRoles


class KVLayout(Enum):
    COPY_AND_GROW = "copy-and-grow"
    SHARED_MAX = "shared-max"


@dataclass(frozen=True)
class Migration:
    """One boundary crossing of the KV memory."""

    from_capacity_tokens: int
    to_capacity_tokens: int
    live_tokens: int
    copied_bytes: int
    allocated_bytes: int
    seconds: float
    peak_reserved_bytes: int  # old + new buffers while both exist


def _seq_slice(role: KVRole, start: int, stop: int) -> tuple[slice, ...]:
    index = [slice(None)] * len(role.shape_template)
    index[role.seq_axis] = slice(start, stop)
    return tuple(index)


def _np_dtype(role: KVRole) -> np.dtype[np.generic]:
    dtype: np.dtype[np.generic] = np.dtype(role.element_type.to_dtype())
    return dtype


class KVCache(ABC):
    """The live KV of one sequence (batch 1) at some rung capacity."""

    def __init__(self, roles: ModelRoles, capacity_tokens: int) -> None:
        self.roles = roles
        self.capacity_tokens = capacity_tokens
        self.live_tokens = 0

    @abstractmethod
    def tensors(self) -> dict[str, ov.Tensor]:
        """Tensors to bind as the past inputs of the current rung's graph."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The current rung's view of each past input (writes land in the cache)."""

    @abstractmethod
    def grow(self, capacity_tokens: int) -> Migration:
        """Move to a larger rung, keeping the live prefix."""

    @property
    @abstractmethod
    def reserved_bytes(self) -> int:
        """Bytes allocated for KV right now."""

    def bytes_for(self, capacity_tokens: int) -> int:
        return self.roles.kv_bytes_per_token * capacity_tokens

    def write(self, present: Mapping[str, np.ndarray], count_tokens: int) -> None:
        """Append the first ``count_tokens`` new tokens of each present output, in place."""
        start = self.live_tokens
        stop = start + count_tokens
        if stop > self.capacity_tokens:
            raise LadderError(
                f"writing {count_tokens} tokens at {start} overflows "
                f"capacity {self.capacity_tokens}"
            )
        views = self.arrays()
        for role in self.roles.kv:
            new = present[role.present_output]
            views[role.past_input][_seq_slice(role, start, stop)] = new[
                _seq_slice(role, 0, count_tokens)
            ]
        self.live_tokens = stop

    def _check_growth(self, capacity_tokens: int) -> None:
        if capacity_tokens <= self.capacity_tokens:
            raise LadderError(
                f"cannot grow KV from {self.capacity_tokens} to {capacity_tokens} tokens"
            )


class CopyAndGrowKV(KVCache):
    """Buffers sized to the current rung; a boundary allocates, copies the live prefix, frees."""

    def __init__(self, roles: ModelRoles, capacity_tokens: int) -> None:
        super().__init__(roles, capacity_tokens)
        self._arrays = self._allocate(capacity_tokens)
        self._tensors = {name: ov.Tensor(a, shared_memory=True) for name, a in self._arrays.items()}

    def _allocate(self, capacity_tokens: int) -> dict[str, np.ndarray]:
        # Zeros, not empty: masked slots still enter the attention matmul, and a NaN
        # there would survive the mask (NaN + -inf is NaN).
        return {
            role.past_input: np.zeros(role.shape(1, capacity_tokens), dtype=_np_dtype(role))
            for role in self.roles.kv
        }

    def tensors(self) -> dict[str, ov.Tensor]:
        return dict(self._tensors)

    def arrays(self) -> dict[str, np.ndarray]:
        return self._arrays

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        old_bytes = self.reserved_bytes
        start = time.perf_counter()
        new = self._allocate(capacity_tokens)
        live = self.live_tokens
        copied = 0
        for role in self.roles.kv:
            src = self._arrays[role.past_input][_seq_slice(role, 0, live)]
            new[role.past_input][_seq_slice(role, 0, live)] = src
            copied += src.nbytes
        seconds = time.perf_counter() - start
        allocated = sum(a.nbytes for a in new.values())
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=live,
            copied_bytes=copied,
            allocated_bytes=allocated,
            seconds=seconds,
            peak_reserved_bytes=old_bytes + allocated,
        )
        self._arrays = new
        self._tensors = {name: ov.Tensor(a, shared_memory=True) for name, a in new.items()}
        self.capacity_tokens = capacity_tokens
        return migration


class SharedMaxKV(KVCache):
    """One buffer at the top capacity; each rung binds a strided view of its first slots."""

    def __init__(self, roles: ModelRoles, capacity_tokens: int, max_capacity_tokens: int) -> None:
        if capacity_tokens > max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {max_capacity_tokens}"
            )
        super().__init__(roles, capacity_tokens)
        self.max_capacity_tokens = max_capacity_tokens
        self._full = {
            role.past_input: np.zeros(role.shape(1, max_capacity_tokens), dtype=_np_dtype(role))
            for role in roles.kv
        }
        # The parent tensors must outlive every ROI view made from them.
        self._parents = {name: ov.Tensor(a, shared_memory=True) for name, a in self._full.items()}

    def tensors(self) -> dict[str, ov.Tensor]:
        views = {}
        for role in self.roles.kv:
            end = role.shape(1, self.capacity_tokens)
            views[role.past_input] = ov.Tensor(self._parents[role.past_input], [0] * len(end), end)
        return views

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            role.past_input: self._full[role.past_input][_seq_slice(role, 0, self.capacity_tokens)]
            for role in self.roles.kv
        }

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._full.values())

    def grow(self, capacity_tokens: int) -> Migration:
        self._check_growth(capacity_tokens)
        if capacity_tokens > self.max_capacity_tokens:
            raise LadderError(
                f"capacity {capacity_tokens} exceeds the shared maximum {self.max_capacity_tokens}"
            )
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=self.live_tokens,
            copied_bytes=0,
            allocated_bytes=0,
            seconds=0.0,
            peak_reserved_bytes=self.reserved_bytes,
        )
        self.capacity_tokens = capacity_tokens
        return migration


def make_kv(
    layout: KVLayout, roles: ModelRoles, capacity_tokens: int, max_capacity_tokens: int
) -> KVCache:
    if layout is KVLayout.SHARED_MAX:
        return SharedMaxKV(roles, capacity_tokens, max_capacity_tokens)
    return CopyAndGrowKV(roles, capacity_tokens)
