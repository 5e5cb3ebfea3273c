"""What ``ovspec.open`` takes: the user's options and the experiment knobs.

``OpenOptions`` is what a user chooses (model, ladder, device, store, policy, ...);
``Tuning`` holds the knobs benchmarks turn (the device/host split, halving the prompt
graph, trimming the IR's weight pages, the event origin, a deadline plan), whose
defaults are what was measured best. Both are frozen and check themselves when made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ovspec.compile.modes import BlobMode, LoadMode
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ir.rewrites import RewriteSet
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import AutoCosts
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import Policy
from ovspec.runtime.schedule import WindowPlan
from ovspec.store.local import Store
from ovspec.store.remote import Remote, RemoteConfig

DEFAULT_PREFILL_CHUNK_TOKENS = 128
DEFAULT_LADDER = Ladder()


@dataclass(frozen=True)
class OpenOptions:
    """A model opened over a ladder on a device: everything a user chooses.

    ``store``: an open ``Store`` (the caller keeps it; it brings its own remote tier),
    a folder, or None for ``Store.default_root()``. ``remote``: a shared tier behind
    the store ``open`` opens (None: ``$OVSPEC_REMOTE``). ``load_mode`` and ``rewrites``
    None take the device profile's. ``kv_layout`` is the sequences' default; None lets
    each sequence take remap where it works.
    """

    model: str | Path  # a folder, a .gguf file or builtin:PRESET
    ladder: Ladder = DEFAULT_LADDER
    device: str = "CPU"
    properties: Mapping[str, str] = field(default_factory=dict)
    store: Store | Path | None = None
    policy: Policy = Policy.ONE_AHEAD
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    compression: Compression | None = None
    blob_mode: BlobMode = BlobMode.WEIGHTLESS
    kv_layout: KVLayout | None = None
    remote: Remote | RemoteConfig | None = None
    load_mode: LoadMode | None = None
    rewrites: RewriteSet | None = None

    def __post_init__(self) -> None:
        if not self.device.strip():
            raise BadRequestError(f"the device is empty; give e.g. {arg('device', 'CPU')}")
        if self.prefill_chunk_tokens < 1:
            raise BadRequestError(
                f"{arg('prefill_chunk_tokens', str(self.prefill_chunk_tokens))} must be at least 1"
            )
        if isinstance(self.store, Store) and self.remote is not None:
            raise BadRequestError(
                f"give {arg('remote')} to the Store you pass as {arg('store')}, not to open()"
            )
        # Frozen in depth: a caller's dict changed later does not change these options.
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))


@dataclass(frozen=True)
class Tuning:
    """Experiment knobs of ``open``; None leaves each to the device profile.

    ``split`` (a ``CoreSplit``, or True for ``CoreSplit.default()``): the device/host
    split of a CPU stand-in. From the end of the loader's foreground until it closes,
    the thread that called ``open`` (the decode thread) is pinned to the device cores
    and every other thread of this process to the host cores (with one device core;
    with several the whole process is on them); OpenVINO's inference threads are bounded
    to the device core count, and every blob is built by a process on the host cores
    into the store and imported here (so the load mode is ``import``).
    ``trim_weight_pages``: keep the IR's mapped ``.bin`` out of the resident set once
    graphs have packed their weights (``runtime/residency.py``), from the first decode
    step on (an eager start: from its beginning; an import-mode start: from its end,
    before the prompt). Default: where the profile says so, for rung graphs (compiled,
    or imported without the split: a cold store compiles its blobs from the IR here; a
    warm one reads no model from it, and the trimmer has nothing to do; the host
    embedding lookup's own mapping of the .bin holds only the rows it read). Under the
    split the host build process, which reads the IR, trims instead.
    ``halve_prompt_graph``: compile the graph the prompt waits for as two halves side by
    side and run them one after the other (``compile/halves.py``). Default: where the
    profile says so, for graphs compiled from the IR, a lazy policy and >= 2 cores.
    ``warm_first_rung``: warm a request's first rung with one inference as it loads,
    beside the prompt's run (False: its first decode step pays that instead). Default:
    where the profile says so.
    ``origin_s``: the ``perf_counter`` value event times count from (default: open).
    ``window_plan``: per-rung predictions that let one-ahead start a successor early.
    ``auto_costs``: what the ``auto`` policy plans from (``autopolicy.AutoCosts``).
    ``release_passed_rungs``: the loader's default for ``decode``'s (None: the policy
    decides, ``decoding.passed_rungs_released``).
    """

    split: CoreSplit | bool | None = None
    trim_weight_pages: bool | None = None
    halve_prompt_graph: bool | None = None
    warm_first_rung: bool | None = None
    origin_s: float | None = None
    window_plan: WindowPlan | None = None
    auto_costs: AutoCosts | None = None
    release_passed_rungs: bool | None = None

    def __post_init__(self) -> None:
        if self.split is True:
            cores = CoreSplit.default()
            if cores is None:
                raise BadRequestError(
                    f"{arg('split')} needs at least 2 usable cores; this process has 1"
                )
            object.__setattr__(self, "split", cores)
        elif self.split is False:
            object.__setattr__(self, "split", None)

    @property
    def cores(self) -> CoreSplit | None:
        """The device/host split asked for, if any."""
        return self.split if isinstance(self.split, CoreSplit) else None
