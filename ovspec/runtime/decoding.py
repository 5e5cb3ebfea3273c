"""The library entry point: open a model as a lazy loader, and decode with it.

``open`` wires a model folder, a store, a compiler and a loader together; ``decode``
runs one sequence (greedy or teacher-forced) through a ``DecodeSession`` whose KV
grows at boundaries, and returns what happened: tokens, logits where asked,
steps, boundaries and the loader's events.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import device_family
from ovspec.compile.modes import BlobMode, LoadMode, default_load_mode
from ovspec.compile.split import (
    THREADS_PROPERTY,
    CoreSplit,
    HostBuilder,
    pin_process,
    pin_split,
    usable_cores,
)
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import resolve_model
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.kv import (
    KVLayout,
    KVLayoutWarning,
    KVSample,
    KVTrace,
    Prefault,
    choose_layout,
    make_kv,
)
from ovspec.runtime.loader import Loader, LoaderEvent, Policy, WindowPlan
from ovspec.runtime.residency import WeightPageTrimmer, WeightPrefault
from ovspec.runtime.session import BoundaryRecord, DecodeSession, StepRecord
from ovspec.store.local import Store
from ovspec.store.remote import Remote, RemoteConfig, open_remote

DEFAULT_PREFILL_CHUNK_TOKENS = 128
DEFAULT_LADDER = Ladder()


def open(  # shadows the builtin inside this module only: the public name is ovspec.open
    model: str | Path,
    ladder: Ladder | str = DEFAULT_LADDER,
    device: str = "CPU",
    properties: Mapping[str, str] | None = None,
    store: Store | Path | str | None = None,
    policy: Policy | str = Policy.ONE_AHEAD,
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
    compression: Compression | str | None = None,
    blob_mode: BlobMode = BlobMode.WEIGHTLESS,
    window_plan: WindowPlan | None = None,
    origin_s: float | None = None,
    kv_layout: KVLayout | str | None = None,
    remote: Remote | RemoteConfig | str | None = None,
    load_mode: LoadMode | str | None = None,
    rewrites: RewriteSet | str | None = None,
    split: CoreSplit | bool | None = None,
    trim_weight_pages: bool | None = None,
    halve_prompt_graph: bool | None = None,
) -> Loader:
    """A lazy loader for ``model`` (a folder, or ``builtin:PRESET``) over ``ladder``.

    ``load_mode`` defaults to the device's (``compile`` on CPU: graphs compiled from the
    IR, the prompt's rung on one graph for both phases, later rungs on static decode
    graphs; ``import`` elsewhere: blobs through the store); ``rewrites`` to the
    device's rewrite set (``RewriteSet.for_device``).
    Close it (or use it as a context manager): it owns its worker thread, and the
    store too when it opened one. ``kv_layout`` becomes ``decode``'s default; a remap
    ladder the layout cannot map is refused here, before anything compiles.
    ``remote``: a shared tier behind the store it opens
    (``s3://BUCKET/PREFIX``; default ``$OVSPEC_REMOTE``); a ``Store`` given as ``store``
    brings its own.
    ``split`` (a ``CoreSplit``, or True for ``CoreSplit.default()``): the device/host
    split of a CPU stand-in. From the end of the loader's foreground (``start``, or the
    first ``get``) until it closes, the thread that called ``open`` (the decode thread)
    is pinned to the device cores and every other thread of this process to the host
    cores (with one device core; with several the whole process is on them);
    OpenVINO's inference threads are bounded to the device core count, and every blob
    is built by a process on the host cores into the store and imported here (so the
    load mode is ``import``).
    ``trim_weight_pages`` (default: on for CPU graphs compiled from the IR, where it was
    measured): keep the IR's mapped ``.bin`` out of the resident set once graphs have
    packed their weights (``runtime/residency.py``; about 1 GiB of RSS on the 0.5B preset),
    from the first decode step on (an eager start: from its beginning).
    ``halve_prompt_graph`` (default: on for CPU graphs compiled from the IR, a lazy
    policy and at least 2 usable cores): compile the graph the prompt waits for as two
    halves side by side and run them one after the other (``compile/halves.py``; a CPU
    compile is one thread; the 0.5B preset's first token 0.17-0.27 s sooner in fresh
    processes, measured).
    """
    ladder = Ladder.parse(ladder) if isinstance(ladder, str) else ladder
    policy = Policy(policy) if isinstance(policy, str) else policy
    properties = loader_properties(device, properties or {})
    compression = Compression.parse(compression) if isinstance(compression, str) else compression
    mode = LoadMode(load_mode) if isinstance(load_mode, str) else load_mode
    cores = CoreSplit.default() if split is True else (split or None)
    if split is True and cores is None:
        raise BadRequestError(f"{arg('split')} needs at least 2 usable cores; this process has 1")
    if cores is not None:
        if mode is LoadMode.COMPILE:
            raise BadRequestError(
                f"{arg('split')} builds on the host and imports here: it needs "
                f"{arg('load_mode', 'import')}, not compile"
            )
        mode = LoadMode.IMPORT
        properties = {THREADS_PROPERTY: str(len(cores.device)), **properties}
    mode = mode or default_load_mode(device)
    trim = _trims_weight_pages(trim_weight_pages, device, mode)
    halves = _halves_prompt_graph(halve_prompt_graph, device, mode, policy)
    rewrite_set = RewriteSet.parse(rewrites) if isinstance(rewrites, str) else rewrites
    owns_store = not isinstance(store, Store)
    if isinstance(store, Store):
        if remote is not None:
            raise BadRequestError(
                f"give {arg('remote')} to the Store you pass as {arg('store')}, not to open()"
            )
        opened = store
    else:
        opened = Store(store or Store.default_root(), remote=_remote(remote))
    compiler: Compiler | None = None
    prefault: WeightPrefault | None = None
    try:
        model_dir = resolve_model(str(model), opened.models_folder)
        ladder.check_fits(model_dir.max_position_embeddings)
        compiler = Compiler(
            model_dir,
            device,
            properties,
            opened,
            compression=compression,
            blob_mode=blob_mode,
            rewrites=rewrite_set,
            load_mode=mode,
            rung_chunk_tokens=prefill_chunk_tokens,
        )
        if kv_layout is not None:
            kv_layout = KVLayout(kv_layout)
            choose_layout(
                kv_layout, compiler.roles(Specialization.decode(ladder.top_tokens)), ladder
            )
        # Started by the loader (at the first decode step, or when an eager start
        # begins); stopped first when it closes, while the compiler still holds the
        # weight its anchor points into.
        trimmer = (
            WeightPageTrimmer.for_weights(model_dir.bin_path, compiler.mapped_weights_address)
            if trim
            else None
        )
        # Maps the weights' pages in while the first graph compiles; not for an eager
        # start, whose trimmer drops pages from its beginning.
        if trim and policy is not Policy.EAGER:
            address = functools.partial(compiler.mapped_weights_address, wait=True)
            prefault = WeightPrefault(model_dir.bin_path, address)
            prefault.start()
    except BaseException:
        if prefault is not None:
            prefault.stop()
        if compiler is not None:
            compiler.close()  # and the IR it may be reading ahead
        if owns_store:
            opened.close()
        raise
    on_close: list[Callable[[], None]] = [compiler.close]
    if owns_store:
        on_close.append(opened.close)
    if prefault is not None:
        on_close.insert(0, prefault.stop)
    if trimmer is not None:
        on_close.insert(0, trimmer.stop)
    pin_threads: Callable[[], None] | None = None
    if cores is not None:
        decode_tid = threading.get_native_id()  # the thread that opens is the one that decodes
        pin_threads = functools.partial(pin_split, cores, decode_tid)
        try:
            _start_split(compiler, cores, opened, on_close)
        except BaseException:
            for callback in on_close:
                callback()
            raise
    try:
        loader = Loader(
            compiler,
            ladder,
            policy,
            prefill_chunk_tokens=prefill_chunk_tokens,
            window_plan=window_plan,
            on_close=on_close,
            origin_s=origin_s,
            kv_layout=kv_layout,
            worker_cores=cores.host if cores is not None else None,
            pin_threads=pin_threads,
            # Not during a lazy start: the first graph packs its weights from the
            # mapping then, and dropping its pages meanwhile cost ~0.1 s of the first
            # prefill (re-faults, TLB shootdowns; measured). Its RSS then is genai's own.
            on_steady=trimmer.start if trimmer is not None else None,
            halve_prompt_graph=halves,
        )
    except BaseException:
        for callback in on_close:
            callback()
        raise
    return loader


def _trims_weight_pages(asked: bool | None, device: str, mode: LoadMode) -> bool:
    reason = WeightPageTrimmer.unsupported_reason()
    if asked and reason is not None:
        raise BadRequestError(f"{arg('trim_weight_pages')} cannot run here: {reason}")
    if asked is None:
        return reason is None and device_family(device) == "CPU" and mode is LoadMode.COMPILE
    return asked


def _halves_prompt_graph(asked: bool | None, device: str, mode: LoadMode, policy: Policy) -> bool:
    if asked and (mode is not LoadMode.COMPILE or policy is Policy.EAGER):
        why = (
            f"{arg('load_mode', 'import')} loads whole blobs; use load_mode='compile'"
            if mode is not LoadMode.COMPILE
            else "an eager start compiles two graphs at once already; use a lazy policy"
        )
        raise BadRequestError(f"{arg('halve_prompt_graph')} cannot apply: {why}")
    if asked is None:
        return (
            device_family(device) == "CPU"  # measured there; NPU graphs come from blobs
            and mode is LoadMode.COMPILE
            and policy is not Policy.EAGER
            and len(usable_cores()) >= 2
        )
    return asked


def _start_split(
    compiler: Compiler,
    cores: CoreSplit,
    store: Store,
    on_close: list[Callable[[], None]],
) -> None:
    """Start the host build process. The loader pins the decode thread to the device
    cores (the rest of this process to the host cores, see ``pin_split``) when its
    foreground is over; OpenVINO has started by now with the whole mask (the Compiler
    listed the devices), which a thread entering its pool gets again."""
    before = tuple(sorted(os.sched_getaffinity(0)))
    on_close.append(lambda: _restore_affinity(before))
    builder = HostBuilder.start(
        model_root=compiler.model_dir.root,
        models_folder=store.models_folder,
        device=compiler.device,
        properties=compiler.properties,
        store_root=store.root,
        compression=str(compiler.compression),
        blob_mode=compiler.blob_mode.value,
        rewrites=compiler.rewrites.canonical,
        host_cores=cores.host,
    )
    compiler.host_builder = builder
    on_close.insert(0, builder.close)


def _restore_affinity(cores: tuple[int, ...]) -> None:
    pin_process(cores)


def _remote(remote: Remote | RemoteConfig | str | None) -> Remote | None:
    if isinstance(remote, Remote):
        return remote
    config = RemoteConfig(remote) if isinstance(remote, str) else remote
    config = config if config is not None else RemoteConfig.from_env()
    return open_remote(config) if config is not None else None


def loader_properties(device: str, properties: Mapping[str, str]) -> dict[str, str]:
    """CPU: turn thread pinning off, unless asked: the loader compiles on a second thread.

    With OpenVINO's default pinning, a compile or import on the loader's thread while
    the decode thread infers leaves decoding pinned badly for the rest of the run: a
    third slower decode on 2 cores, measured (docs/benchmarks/bench.md). Pinning cannot
    change a blob (tests/test_devices.py), so keys and stored blobs are unaffected.
    """
    props = dict(properties)
    if device_family(device) == "CPU" and "ENABLE_CPU_PINNING" not in props:
        props["ENABLE_CPU_PINNING"] = "NO"
    return props


def passed_rungs_released(policy: Policy, asked: bool | None) -> bool:
    """Whether a sequence drops the graphs of the rungs it has left.

    An eager loader keeps them unless asked: it built every rung up front, so its peak
    memory already holds them all, and the next sequence needs the small rungs again.
    Dropping one is not free either: the compiled model's destructor frees its packed
    weights (~1 GB for the 0.5B preset) holding the GIL, which stalled the decode step
    0.10-0.12 s, from a background thread as much as from the decode's own (s25).
    """
    return policy is not Policy.EAGER if asked is None else asked


def check_prompt_ids(
    prompt_ids: Sequence[int],
    vocab_tokens: int | None,
    top_tokens: int,
    forced_ids: Sequence[int] = (),
) -> None:
    """Refuse a prompt the model cannot take, before anything compiles: empty, ids
    outside ``[0, vocab_tokens)`` (they index past the embedding table: garbage tokens or
    an out-of-bounds gather), or longer than the top rung. One ``BadRequestError``
    naming the first problem."""
    if not prompt_ids:
        raise BadRequestError("the prompt is empty; give at least one token")
    for where, ids in (("prompt", prompt_ids), ("forced", forced_ids)):
        bad = [
            (i, t)
            for i, t in enumerate(ids)
            if t < 0 or (vocab_tokens is not None and t >= vocab_tokens)
        ]
        if bad:
            at, token = bad[0]
            bound = f"[0, {vocab_tokens})" if vocab_tokens is not None else "ids >= 0"
            raise BadRequestError(
                f"token id {token} at {where} position {at} is outside the model's vocabulary "
                f"{bound} ({len(bad)} such ids); give ids the model's tokenizer produces"
            )
    if len(prompt_ids) > top_tokens:
        raise BadRequestError(
            f"the prompt has {len(prompt_ids)} tokens, over the top rung {top_tokens}; "
            f"extend {arg('ladder')} or shorten the prompt"
        )


@dataclass(frozen=True)
class DecodeResult:
    """One sequence's run: what came out and what happened on the way."""

    prompt_tokens: int
    token_ids: tuple[int, ...]  # generated (greedy) or forced (teacher-forced)
    rungs: tuple[int, ...]  # capacities used, in order
    steps: tuple[StepRecord, ...]
    boundaries: tuple[BoundaryRecord, ...]
    events: tuple[LoaderEvent, ...]
    # origin -> the prompt can run (foreground compile wall): the first rung's prefill
    # graph is ready. Its decode graph may still be loading on the worker; if the first
    # decode step has to wait for it, that wait is a WAIT event in ``events``.
    ready_s: float
    first_token_s: float  # origin -> the prompt is processed (time to first token)
    finished_s: float  # origin -> last token (critical path)
    reserved_kv: tuple[tuple[int, int], ...]  # (live tokens, reserved KV bytes) per step
    logits: dict[int, np.ndarray] = field(default_factory=dict)  # step index -> logits
    kv_layout: str = ""  # the layout used
    kv_note: str = ""  # why it is not the one asked for (empty when it is)
    kv_samples: tuple[KVSample, ...] = ()  # after the prefill and each step


def decode(
    loader: Loader,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 0,
    forced_ids: Sequence[int] | None = None,
    kv_layout: KVLayout | None = None,
    stop_ids: frozenset[int] = frozenset(),
    keep_logits: Callable[[int, int], bool] | None = None,
    on_token: Callable[[int], object] | None = None,
    release_passed_rungs: bool | None = None,
    choose: Callable[[np.ndarray], int] | None = None,
    prefault_lead_tokens: int | None = None,
    measure_physical: bool = False,
) -> DecodeResult:
    """Greedy decoding (``max_new_tokens``) or teacher forcing (``forced_ids``).

    ``keep_logits(step, live_tokens)`` chooses which steps' logits to return (step 0
    is the prompt's last position); ``on_token`` streams generated ids and ends the
    sequence by returning a true value; ``choose`` picks each next token from the logits
    (default ``argmax``: greedy; see ``runtime.sampling``). With
    ``release_passed_rungs`` the loader drops the graphs of rungs the sequence has left
    (and the prefill graph once the prompt is in): a rung's compiled model holds its
    own copy of the weights. Keep them when the loader serves more sequences. None (the
    default) lets the policy decide: an eager loader built every rung to have them all
    and keeps them (a release also stalls the decode ~0.1 s on a 0.5B model, under the
    GIL: see ``passed_rungs_released``); lazy policies release.

    ``kv_layout`` None takes the loader's, else the default: remap where it works,
    copy-and-grow elsewhere (``kv_note`` says why). ``prefault_lead_tokens`` makes
    copy-and-grow commit its successor's copy target that many tokens before each
    boundary; ``measure_physical`` reads the KV's committed bytes after every step.
    """
    if not prompt_ids:
        raise BadRequestError("the prompt is empty; give at least one token id")
    ladder = loader.ladder
    # Roles (and the vocabulary) from memory, a stored blob's record, or the IR: the
    # ids are checked before anything compiles.
    first_guess = Specialization.decode(ladder.rung_for(min(len(prompt_ids), ladder.top_tokens)))
    roles = loader.compiler.roles(first_guess)
    check_prompt_ids(prompt_ids, roles.vocab_tokens, ladder.top_tokens, forced_ids or ())
    # Greedy decoding never feeds its last token back; teacher forcing feeds them all.
    fed = len(forced_ids) if forced_ids is not None else max(max_new_tokens - 1, 0)
    if len(prompt_ids) + fed > ladder.top_tokens:
        raise BadRequestError(
            f"{len(prompt_ids)} prompt tokens and {fed} fed-back tokens need "
            f"{len(prompt_ids) + fed} KV positions, over the top rung {ladder.top_tokens}; "
            f"extend {arg('ladder')} or lower {arg('max_new_tokens')}"
        )
    origin = loader.origin_s
    choice = choose_layout(kv_layout or loader.kv_layout, roles, ladder)
    if choice.failover:
        warnings.warn(choice.note, KVLayoutWarning, stacklevel=2)
    first = ladder.rung_for(len(prompt_ids))
    loader.start(first)
    prompt_ready_s = time.perf_counter() - origin
    prefault = Prefault(ladder, prefault_lead_tokens) if prefault_lead_tokens else None
    kv = make_kv(choice.layout, roles, first, ladder.top_tokens, prefault, ladder)
    trace = KVTrace(kv, origin, measure_physical)
    chunk = loader.prefill_chunk_tokens or DEFAULT_PREFILL_CHUNK_TOKENS
    release = passed_rungs_released(loader.policy, release_passed_rungs)
    session = DecodeSession(
        roles, ladder, kv, loader, chunk, origin_s=origin, release_passed=release
    )
    kept: dict[int, np.ndarray] = {}
    try:
        logits = session.prefill(prompt_ids)
        first_token_s = time.perf_counter() - origin
        if keep_logits is not None and keep_logits(0, kv.live_tokens):
            kept[0] = logits
        trace.record()
        tokens: list[int] = []
        budget = len(forced_ids) if forced_ids is not None else max_new_tokens
        for step in range(1, budget + 1):
            if forced_ids is not None:
                token = int(forced_ids[step - 1])
            else:
                token = int(np.argmax(logits)) if choose is None else choose(logits)
            tokens.append(token)
            stop = bool(on_token(token)) if on_token is not None else False
            if forced_ids is None and (stop or token in stop_ids or step == budget):
                break
            logits = session.step(token)
            trace.record()
            if keep_logits is not None and keep_logits(step, kv.live_tokens):
                kept[step] = logits
        finished_s = time.perf_counter() - origin
    finally:
        try:
            session.close()  # releases what the sequence held back to its end
        finally:
            kv.close()
    rungs = [first] + [b.migration.to_capacity_tokens for b in session.boundaries]
    return DecodeResult(
        prompt_tokens=len(prompt_ids),
        token_ids=tuple(tokens),
        rungs=tuple(rungs),
        steps=tuple(session.steps),
        boundaries=tuple(session.boundaries),
        events=tuple(loader.events),
        ready_s=prompt_ready_s,
        first_token_s=first_token_s,
        finished_s=finished_s,
        reserved_kv=trace.reserved_pairs(),
        logits=kept,
        kv_layout=choice.layout.value,
        kv_note=choice.note,
        kv_samples=tuple(trace.samples),
    )
