"""The modes a ``Compiler`` runs in: whether blobs carry the weights (``BlobMode``) and
whether graphs come from the store or straight from the IR (``LoadMode``), with the
compile properties that follow from them. Each device profile names its default mode.
"""

from __future__ import annotations

from enum import Enum


class BlobMode(Enum):
    """Whether a blob carries the weights. Weightless blobs point into the model's
    own .bin by offset, so a ladder stores the weights once, not once per rung."""

    FULL = "full"
    WEIGHTLESS = "weightless"


class LoadMode(Enum):
    """How ``Compiler.load`` makes a graph ready.

    IMPORT builds the blob into the store (on a miss) and imports it: the NPU path, and
    a CPU option. COMPILE compiles the specialization from the prepared IR in memory and
    never touches the store: the CPU plugin's default, as an imported CPU graph loses
    the plugin's LLM treatment (``devices/cpu.py``). PAGED compiles one PagedAttention
    graph from the IR for the prompt and every step, with no rung graphs at all
    (``runtime/paged.py``; a device whose profile runs that op).
    """

    IMPORT = "import"
    COMPILE = "compile"
    PAGED = "paged"


def blob_compile_properties(mode: BlobMode) -> dict[str, str]:
    """Compile properties that make a device export a weightless blob.

    CPU honours CACHE_MODE=OPTIMIZE_SIZE (ENABLE_WEIGHTLESS alone does nothing); the
    NPU plugin reads ENABLE_WEIGHTLESS when no CACHE_DIR is set. Both are given.
    """
    if mode is BlobMode.FULL:
        return {}
    return {"CACHE_MODE": "OPTIMIZE_SIZE", "ENABLE_WEIGHTLESS": "YES"}
