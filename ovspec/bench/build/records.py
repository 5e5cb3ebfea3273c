"""The build benchmark's records: its figures (each a ``Spread``, with the ``Environment``
they were measured in) and the report document (``to_json`` is its stored, versioned form).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ovspec.bench.common.records import Environment, Spread

# History: 1 — first format (2026-11).
REPORT_FORMAT_VERSION = 1

# The bench stores must never evict mid-run: a full-blob ladder of a 7B model exceeds
# the store's default 20 GiB limit, and an eviction would turn warm hits into misses.
NO_EVICTION_BYTES = 2**50


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class KeyFigures:
    """Key derivation of the first specialization; the rest share the static part."""

    weights_bytes: int
    compiler_start_s: Spread  # ov.Core() + device facts (CPU: a one-op probe compile)
    cold_uncached_s: Spread | None  # empty memo, .bin evicted from the page cache
    cold_cached_s: Spread  # empty memo, .bin in the page cache: hashes the weights
    memo_memory_s: Spread  # new Compiler, same in-memory digest memo
    memo_disk_s: Spread  # new Compiler, new memo object over the on-disk memo
    next_key_s: Spread  # same Compiler, another specialization (static part cached)
    prepare_s: Spread  # read the IR + stateful->stateless + new-token outputs


@dataclass(frozen=True)
class SpecFigures:
    blob_mode: str
    specialization: str
    phase: str
    capacity_tokens: int
    chunk_tokens: int
    compile_s: Spread
    export_s: Spread
    blob_bytes: tuple[int, ...]  # one per repeat (equal unless export is not deterministic)
    import_s: Spread  # Program.import_s: import from the store's memory-mapped file
    hit_s: Spread  # Compiler.load wall minus import: key + lookup + checksum + touch


@dataclass(frozen=True)
class LadderFigures:
    """The whole ladder in one blob mode, cold (empty store) and warm (all hits)."""

    blob_mode: str
    specializations: int
    cold_build_s: Spread  # run_build on an empty store, Compiler start included
    cold_compile_s: Spread  # summed over the specializations (overlapping if jobs > 1)
    cold_export_s: Spread
    # Keys, IR preparation, store commits (fsync, checksum, index); None if jobs > 1,
    # where the sums above overlap in time and a difference means nothing.
    cold_other_s: Spread | None
    # Process CPU seconds (user+sys) of the cold build: on 2 shared cores, a wall that
    # grows while this stays put means a neighbour took the CPU, not that ovspec slowed.
    cold_cpu_s: Spread
    warm_build_s: Spread  # run_build again on the same store: all hits
    cold_over_warm: Spread  # paired per repeat
    warm_load_s: Spread  # fresh Compiler: load (hit + import) every specialization
    cold_over_warm_load: Spread
    cli_warm_build_s: Spread | None  # `ovspec build` in a new process, all hits
    cli_error: str | None
    blob_bytes: int  # sum of the ladder's blobs
    store_bytes: int  # every file under the store root (blobs, sidecars, index, memo)
    largest_blob_bytes: int
    check_problems: tuple[str, ...]  # Store.check() at the end of each repeat
    load_average_1m: tuple[float, ...]  # at the start of each repeat's cold build


@dataclass(frozen=True)
class StorageFigures:
    model_bin_bytes: int
    weightless_ladder_bytes: int | None
    full_ladder_bytes: int | None
    one_full_blob_bytes: int | None  # the largest full blob of the top rung

    @property
    def weights_copies_full(self) -> float | None:
        """Full ladder bytes in units of the model's weights: ~rungs x phases."""
        if self.full_ladder_bytes is None:
            return None
        return self.full_ladder_bytes / self.model_bin_bytes

    @property
    def full_over_weightless(self) -> float | None:
        if self.full_ladder_bytes is None or not self.weightless_ladder_bytes:
            return None
        return self.full_ladder_bytes / self.weightless_ladder_bytes


@dataclass(frozen=True)
class RssMark:
    after: str
    peak_rss_bytes: int


@dataclass(frozen=True)
class BenchReport:
    command: str
    environment: Environment
    model: str
    model_reference: str
    ladder: tuple[int, ...]
    phases: tuple[str, ...]
    chunk_tokens: int
    device: str
    properties: dict[str, str]
    repeats: int
    jobs: int
    keys: KeyFigures
    specs: tuple[SpecFigures, ...]
    ladders: tuple[LadderFigures, ...]
    storage: StorageFigures
    rss: tuple[RssMark, ...]
    duration_s: float
    format_version: int = REPORT_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["storage"]["weights_copies_full"] = self.storage.weights_copies_full
        doc["storage"]["full_over_weightless"] = self.storage.full_over_weightless
        return doc
