"""What every KV layout is: the ``KVCache`` interface (say whether a model and ladder
fit, bind, write in place, grow at a boundary), the ``Migration`` record of one
boundary, and the trace of reserved and physical KV bytes over a run. The layouts are
one module each (``kvgrow``, ``kvshared``, ``kvremap``); ``kv`` registers them.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Protocol

import numpy as np
import openvino as ov

from ovspec.errors import LadderError
from ovspec.ir.roles import KVRole, ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem


class KVLayout(Enum):
    COPY_AND_GROW = "copy-and-grow"
    SHARED_MAX = "shared-max"
    REMAP = "remap"


class KVLayoutWarning(RuntimeWarning):
    """The layout asked for cannot run here; another one is used instead."""


@dataclass(frozen=True)
class Unsupported:
    """Why a layout cannot hold a model's KV over a ladder, in one clause."""

    reason: str
    # The machine lacks what the layout needs: a request for it fails over to the
    # default with a warning. Otherwise the model or ladder does not fit: refused.
    platform: bool = False


@dataclass(frozen=True)
class Prefault:
    """Fault the successor rung's copy target in ``lead_tokens`` before each boundary,
    on a thread. ``use_memset`` forces memset where ``MADV_POPULATE_WRITE`` exists."""

    ladder: Ladder
    lead_tokens: int = 16
    use_memset: bool = False

    def __post_init__(self) -> None:
        if self.lead_tokens < 1:
            raise LadderError(f"the pre-fault lead must be >= 1 token, got {self.lead_tokens}")


@dataclass(frozen=True)
class Migration:
    """One boundary crossing of the KV memory.

    ``seconds`` is the growth itself (allocate, wait for a pre-fault still running,
    copy and free, or move); binding the new rung's tensors is timed by the session. The
    physical peak is measured (pagemap) after the timed part, with old and new
    buffers both still held: None where it cannot be measured.
    """

    from_capacity_tokens: int
    to_capacity_tokens: int
    live_tokens: int
    copied_bytes: int
    allocated_bytes: int  # virtual: the new rung's buffers
    seconds: float
    peak_reserved_bytes: int  # virtual: old + new buffers while both exist
    moved_bytes: int = 0  # pages that changed address (remap): no byte copied
    peak_physical_bytes: int | None = None
    copy_seconds: float = 0.0  # of ``seconds``: allocate or wait, then copy (not the free)


def seq_slice(role: KVRole, start: int, stop: int) -> tuple[slice, ...]:
    index = [slice(None)] * len(role.shape_template)
    index[role.seq_axis] = slice(start, stop)
    return tuple(index)


_DTYPES: dict[str, np.dtype[np.generic]] = {}


def np_dtype(role: KVRole) -> np.dtype[np.generic]:
    # Memoized: ov.Type.to_dtype() costs microseconds, and a boundary asks once per tensor.
    name = role.element_type.get_type_name()
    if name not in _DTYPES:
        _DTYPES[name] = np.dtype(role.element_type.to_dtype())
    return _DTYPES[name]


@dataclass(frozen=True)
class BlockShape:
    """How one past tensor splits into blocks that move whole at a boundary.

    ``blocks`` is the product of the axes between batch and the sequence axis (the KV
    heads of ``[1, H, C, D]``); one block holds ``capacity * token_bytes`` bytes.
    """

    blocks: int
    token_bytes: int

    @classmethod
    def of(cls, role: KVRole) -> BlockShape:
        dims = role.shape(1, 1)
        inner = math.prod(dims[role.seq_axis + 1 :])
        return cls(math.prod(dims[1 : role.seq_axis]), inner * int(role.element_type.size))

    def quantum_tokens(self, page_bytes: int) -> int:
        """The smallest capacity step whose blocks are whole pages (1 for a single block,
        which starts the tensor's range and so never needs to)."""
        if self.blocks == 1:
            return 1
        return page_bytes // math.gcd(page_bytes, self.token_bytes)


class KVCache(ABC):
    """The live KV of one sequence (batch 1) at some rung capacity.

    Tensors and arrays handed out are valid until the next ``grow`` (the session binds
    a new request after each); ``close`` releases the memory once nothing points into it.
    """

    layout: ClassVar[KVLayout]
    # Whether a sequence that names no layout may get this one (in the registry's order).
    chosen_by_default: ClassVar[bool]

    @classmethod
    @abstractmethod
    def create(
        cls,
        roles: ModelRoles,
        capacity_tokens: int,
        max_capacity_tokens: int,
        ladder: Ladder | None = None,
        prefault: Prefault | None = None,
    ) -> KVCache:
        """A cache at ``capacity_tokens`` that may grow to ``max_capacity_tokens`` through
        ``ladder``'s rungs (a layout takes what it uses of these)."""

    @classmethod
    def unsupported(cls, roles: ModelRoles, ladder: Ladder) -> Unsupported | None:
        """None where this layout can hold ``roles``' KV over ``ladder`` here."""
        return None

    @classmethod
    def refuse(cls, roles: ModelRoles, ladder: Ladder) -> None:
        """Raise the one-line error of an explicit request this layout cannot take."""
        why = cls.unsupported(roles, ladder)
        if why is not None:
            raise LadderError(f"{why.reason}; choose another KV layout")

    def __init__(self, roles: ModelRoles, capacity_tokens: int) -> None:
        self.roles = roles
        self.capacity_tokens = capacity_tokens
        self.live_tokens = 0
        self._kv_bytes_per_token = roles.kv_bytes_per_token
        # Measure each boundary's physical peak (pagemap: ~50 ns a committed page, after
        # the timed part of grow but inside the call). Off unless a trace asks for it.
        self.measure_physical = False

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
        """Virtual bytes allocated for KV right now (pre-faulted successors included)."""

    @abstractmethod
    def spans(self) -> list[tuple[int, int]]:
        """(address, bytes) of every buffer held now: what ``physical_bytes`` reads."""

    def physical_bytes(self) -> int | None:
        """Bytes of those buffers the process has committed (pagemap), None if unknown."""
        return vmem.resident_bytes(self.spans())

    def _peak(self, spans: list[tuple[int, int]]) -> int | None:
        return vmem.resident_bytes(spans) if self.measure_physical else None

    def close(self) -> None:  # noqa: B027 - optional hook: most layouts own numpy arrays only
        """Release what the cache holds; every request bound to its tensors must be gone."""

    def bytes_for(self, capacity_tokens: int) -> int:
        return self._kv_bytes_per_token * capacity_tokens

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
            views[role.past_input][seq_slice(role, start, stop)] = new[
                seq_slice(role, 0, count_tokens)
            ]
        self.live_tokens = stop

    def _check_growth(self, capacity_tokens: int) -> None:
        if capacity_tokens <= self.capacity_tokens:
            raise LadderError(
                f"cannot grow KV from {self.capacity_tokens} to {capacity_tokens} tokens"
            )


@dataclass(frozen=True)
class KVSample:
    """The KV memory after the prefill or one decode step."""

    at_s: float  # seconds since the run's origin
    live_tokens: int
    reserved_bytes: int  # virtual
    physical_bytes: int | None  # measured; None when not asked for or not measurable


class TracedKV(Protocol):
    """What a trace reads of a KV: a layout here, or the paged path's blocks."""

    live_tokens: int
    measure_physical: bool

    @property
    def reserved_bytes(self) -> int: ...

    def physical_bytes(self) -> int | None: ...


class KVTrace:
    """Samples of one sequence's KV memory, taken after the prefill and each step."""

    def __init__(self, kv: TracedKV, origin_s: float, measure_physical: bool) -> None:
        kv.measure_physical = measure_physical  # boundary peaks too
        self._kv = kv
        self._origin_s = origin_s
        self._measure = measure_physical
        self.samples: list[KVSample] = []

    def record(self) -> None:
        kv = self._kv
        physical = kv.physical_bytes() if self._measure else None
        at = time.perf_counter() - self._origin_s
        self.samples.append(KVSample(at, kv.live_tokens, kv.reserved_bytes, physical))

    def reserved_pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple((s.live_tokens, s.reserved_bytes) for s in self.samples)
