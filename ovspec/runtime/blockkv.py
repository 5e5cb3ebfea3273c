"""One sequence's paged KV: block arrays per cache input, typed as the compiled paged
graph wants, reserved one rung at a time and grown at a boundary (in place where the
kernel maps pages, else by copying the live blocks).
"""

from __future__ import annotations

import math
import time

import numpy as np
import openvino as ov

from ovspec.compile.halves import CompiledGraph
from ovspec.errors import LadderError
from ovspec.ir import paged as graph
from ovspec.runtime import vmem
from ovspec.runtime.kvcache import Migration

# The CPU plugin's PagedAttention block: tokens per block of every cache array.
BLOCK_TOKENS = 32


def cache_layouts(compiled: CompiledGraph) -> dict[str, tuple[ov.Shape, ov.Type]]:
    """Each cache input's block shape (without the block axis) and element type."""
    layouts = {}
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith((graph.KEY_CACHE_PREFIX, graph.VALUE_CACHE_PREFIX)):
            dims = ov.Shape([d.get_length() for d in list(port.get_partial_shape())[1:]])
            layouts[name] = (dims, port.get_element_type())
    return layouts


class BlockKV:
    """One sequence's KV as ``[blocks, ...]`` byte arrays, one per cache input, typed as
    the compiled graph wants (bf16, u8 or u4 included), holding its rung's capacity.
    ``reserved_tokens`` (at most the capacity) holds fewer blocks where the sequence
    cannot fill its rung. With ``ceiling_tokens`` (the most it may ever reserve) and a
    kernel that maps pages, each array is a view of an address range reserved up to the
    ceiling whose pages (huge where the kernel gives them) commit on first write: growing
    widens the views, no byte copied; otherwise growing copies the live blocks once."""

    def __init__(
        self,
        layouts: dict[str, tuple[ov.Shape, ov.Type]],
        capacity_tokens: int,
        reserved_tokens: int | None = None,
        ceiling_tokens: int | None = None,
    ) -> None:
        self._layouts = layouts
        self.capacity_tokens = capacity_tokens
        self.reserved_tokens = min(reserved_tokens or capacity_tokens, capacity_tokens)
        self.live_tokens = 0
        self.measure_physical = False
        self._regions: dict[str, vmem.Region] = {}
        if ceiling_tokens is not None and vmem.unsupported_reason() is None:
            blocks = math.ceil(max(ceiling_tokens, self.reserved_tokens) / BLOCK_TOKENS)
            # Huge pages: a decode step reads every live block of every layer.
            self._regions = {
                name: vmem.Region(blocks * self._block_bytes(name), huge_pages=True)
                for name in layouts
            }
        self._arrays = self._allocate(self.reserved_tokens)

    def _block_bytes(self, name: str) -> int:
        dims, kind = self._layouts[name]
        return int(math.prod(dims) * kind.bitwidth // 8)

    def _in_regions(self, capacity_tokens: int) -> bool:
        blocks = math.ceil(capacity_tokens / BLOCK_TOKENS)
        return bool(self._regions) and all(
            blocks * self._block_bytes(n) <= r.size_bytes for n, r in self._regions.items()
        )

    def _allocate(self, capacity_tokens: int) -> dict[str, np.ndarray]:
        blocks = math.ceil(capacity_tokens / BLOCK_TOKENS)
        if self._in_regions(capacity_tokens):  # views of the reserved ranges
            return {
                name: region.array(0, (blocks, self._block_bytes(name)), np.dtype(np.uint8))
                for name, region in self._regions.items()
            }
        return {
            name: np.zeros((blocks, self._block_bytes(name)), np.uint8) for name in self._layouts
        }

    def tensors(self) -> dict[str, ov.Tensor]:
        return {
            name: ov.Tensor(array, ov.Shape([len(array), *self._layouts[name][0]]), kind)
            for name, array in self._arrays.items()
            for kind in (self._layouts[name][1],)
        }

    def grow(self, capacity_tokens: int, reserved_tokens: int | None = None) -> Migration:
        """Move to ``capacity_tokens`` (``reserved_tokens`` of it): wider views of the
        reserved ranges, or new arrays, the live blocks copied, the old freed."""
        if capacity_tokens <= self.capacity_tokens:
            raise LadderError(f"cannot grow KV from {self.capacity_tokens} to {capacity_tokens}")
        began = time.perf_counter()
        old, old_bytes = self._arrays, self.reserved_bytes
        reserved = min(reserved_tokens or capacity_tokens, capacity_tokens)
        in_place = self._in_regions(reserved)
        new = self._allocate(reserved)
        live_blocks = math.ceil(self.live_tokens / BLOCK_TOKENS)
        copied = 0
        for name, array in old.items() if not in_place else ():
            new[name][:live_blocks] = array[:live_blocks]
            copied += array[:live_blocks].nbytes
        copy_s = time.perf_counter() - began
        allocated = sum(a.nbytes for a in new.values())
        self._arrays = new
        del old
        migration = Migration(
            from_capacity_tokens=self.capacity_tokens,
            to_capacity_tokens=capacity_tokens,
            live_tokens=self.live_tokens,
            copied_bytes=copied,
            allocated_bytes=allocated,
            seconds=time.perf_counter() - began,
            peak_reserved_bytes=allocated if in_place else old_bytes + allocated,
            copy_seconds=copy_s,
        )
        self.capacity_tokens, self.reserved_tokens = capacity_tokens, reserved
        return migration

    @property
    def reserved_bytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def arrays(self) -> dict[str, np.ndarray]:
        """Each cache input's ``[blocks, bytes]`` array (writes land in the KV); valid
        until the next ``grow``."""
        return dict(self._arrays)

    def spans(self) -> list[tuple[int, int]]:
        return [(a.ctypes.data, a.nbytes) for a in self._arrays.values()]

    def physical_bytes(self) -> int | None:
        return vmem.resident_bytes(self.spans())

    def close(self) -> None:
        self._arrays = {}
        self._regions = {}  # each unmapped once no view or bound tensor holds it
