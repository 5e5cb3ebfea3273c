"""What the compiler hands back: a specialization made available in the store
(``BuildOutcome``) and one loaded and ready for infer requests (``Program``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ovspec.compile.halves import CompiledGraph
from ovspec.ir.specialize import Specialization


@dataclass(frozen=True)
class BuildOutcome:
    """One specialization made available in the store (or compiled without one)."""

    spec: Specialization
    key_hex: str
    hit: bool
    compile_s: float  # this build's compile (miss) or the compile a hit saved
    export_s: float
    wait_s: float  # waiting for another process building the same key
    blob_bytes: int
    path: Path
    stored: bool = True  # False: the store failed open; ``path`` is a private temp file
    # From the remote tier: ``hit`` is False (the local store missed) and ``compile_s``
    # is the compile the fetch saved; ``fetch_s`` is what fetching took.
    fetched: bool = False
    fetch_s: float = 0.0
    host_s: float = 0.0  # split: the host process's whole build (0: built here)


@dataclass(frozen=True)
class Program:
    """A compiled specialization ready for infer requests."""

    spec: Specialization
    compiled: CompiledGraph
    build: BuildOutcome
    import_s: float
    # The mapped blob file: the CPU plugin keeps pointing into it, so it must live as
    # long as ``compiled`` (dropping it segfaults inference).
    backing: np.ndarray
    # COMPILE mode: the graph was compiled (and run) for another specialization of its
    # rung already, e.g. the decode of a rung whose prefill graph also decodes.
    reused: bool = False
