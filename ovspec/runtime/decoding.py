"""The library entry points: ``open`` a model as a lazy loader, and ``decode`` with it.

``open`` takes the user's options as keywords (and the experiment knobs as one
``Tuning``) and hands them to ``runtime.opening``; ``decode`` runs one sequence (greedy
or teacher-forced) through a ``DecodeSession`` whose KV grows at boundaries, and
returns what happened: tokens, logits where asked, steps, boundaries and the loader's
events.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.compile.devices import profile_for
from ovspec.compile.modes import BlobMode, LoadMode
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.autorun import AutoLoader
from ovspec.runtime.blockkv import BlockKV
from ovspec.runtime.kv import (
    KVCache,
    KVLayout,
    KVLayoutWarning,
    KVSample,
    KVTrace,
    Prefault,
    choose_layout,
    make_kv,
)
from ovspec.runtime.loader import Loader, LoaderEvent, Policy
from ovspec.runtime.opening import open_loader, rung_loader
from ovspec.runtime.options import (
    DEFAULT_LADDER,
    DEFAULT_PREFILL_CHUNK_TOKENS,
    OpenOptions,
    Tuning,
)
from ovspec.runtime.paged import PagedLoader, PagedSequence
from ovspec.runtime.session import BoundaryRecord, DecodeSession, StepRecord
from ovspec.store.local import Store
from ovspec.store.remote import Remote, RemoteConfig

__all__ = [
    "DecodeResult",
    "OpenOptions",
    "Tuning",
    "check_prompt_ids",
    "check_request_fits",
    "decode",
    "loader_properties",
    "open",
    "open_rungs",
    "passed_rungs_released",
    "reachable_tokens",
]


def open(  # shadows the builtin inside this module only: the public name is ovspec.open
    model: str | Path,
    ladder: Ladder | str = DEFAULT_LADDER,
    device: str = "CPU",
    properties: Mapping[str, str] | None = None,
    store: Store | Path | str | None = None,
    policy: Policy | str = Policy.ONE_AHEAD,
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
    compression: Compression | str | None = None,
    blob_mode: BlobMode | str = BlobMode.WEIGHTLESS,
    kv_layout: KVLayout | str | None = None,
    remote: Remote | RemoteConfig | str | None = None,
    load_mode: LoadMode | str | None = None,
    rewrites: RewriteSet | str | None = None,
    *,
    tuning: Tuning | None = None,
) -> Loader | PagedLoader:
    """A lazy loader for ``model`` (a folder, a ``.gguf`` file or ``builtin:PRESET``)
    over ``ladder``: the options of ``OpenOptions``, each also as its text spelling.

    ``load_mode`` defaults to the device profile's: on CPU ``paged`` (one PagedAttention
    graph from the IR, the KV in blocks grown rung by rung), or ``compile`` when the
    options ask for rung graphs (a KV layout, compression, rewrites: graphs compiled from
    the IR, the prompt's rung on one graph for both phases, later rungs on static decode
    graphs); ``import`` elsewhere (blobs through the store). ``rewrites`` defaults to the
    profile's rewrite set. Close the loader (or use it as a context manager): it owns
    its worker thread, and the store too when it opened one. ``kv_layout`` becomes
    ``decode``'s default; a remap ladder the layout cannot map is refused here, before
    anything compiles. ``remote``: a shared tier behind the store it opens
    (``s3://BUCKET/PREFIX``; default ``$OVSPEC_REMOTE``); a ``Store`` given as ``store``
    brings its own. ``tuning``: the experiment knobs (``Tuning``: the device/host split,
    halving the prompt graph, trimming weight pages, the event origin, a deadline plan).
    """
    options = OpenOptions(
        model=model,
        ladder=Ladder.parse(ladder) if isinstance(ladder, str) else ladder,
        device=device,
        properties=properties or {},
        store=Path(store) if isinstance(store, str) else store,
        policy=Policy(policy),
        prefill_chunk_tokens=prefill_chunk_tokens,
        compression=Compression.parse(compression) if isinstance(compression, str) else compression,
        blob_mode=BlobMode(blob_mode),
        kv_layout=KVLayout(kv_layout) if kv_layout is not None else None,
        remote=RemoteConfig(remote) if isinstance(remote, str) else remote,
        load_mode=LoadMode(load_mode) if load_mode is not None else None,
        rewrites=RewriteSet.parse(rewrites) if isinstance(rewrites, str) else rewrites,
    )
    return open_loader(options, tuning)


def loader_properties(device: str, properties: Mapping[str, str]) -> dict[str, str]:
    """The properties ``open`` compiles with on ``device``: the user's, completed by the
    device profile (on CPU: thread pinning off unless asked)."""
    return profile_for(device, properties).loader_properties(properties)


def passed_rungs_released(policy: Policy, asked: bool | None) -> bool:
    """Whether a sequence drops the graphs of the rungs it has left.

    An eager loader keeps them unless asked: it built every rung up front, so its peak
    memory already holds them all, and the next sequence needs the small rungs again.
    Dropping one is not free either: the compiled model's destructor frees its packed
    weights (~1 GB for the 0.5B preset) holding the GIL, which stalls the decode step by
    about 0.1 s, from a background thread as much as from the decode's own. A lazy
    loader releases: on the NPU path (weights in one bank) that keeps a ladder's peak RSS
    near its top rung's (docs/npu.md).
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


def open_rungs(model: str | Path, ladder: Ladder | str = DEFAULT_LADDER, **options: Any) -> Loader:
    """``open`` for work that measures rung graphs: the device's rung load mode unless
    one is given; ``load_mode="paged"`` is refused."""
    if options.get("load_mode") is None:
        device, props = options.get("device", "CPU"), options.get("properties") or {}
        options["load_mode"] = profile_for(device, props).rung_load_mode
    return rung_loader(open(model, ladder, **options), "this measures rung graphs:")


def decode(
    loader: Loader | PagedLoader,
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
    default) takes the loader's (``Tuning.release_passed_rungs``), and if that is None
    lets the policy decide: an eager loader built every rung to have them all
    and keeps them (a release also stalls the decode ~0.1 s on a 0.5B model, under the
    GIL: see ``passed_rungs_released``); lazy policies release.

    ``kv_layout`` None takes the loader's, else the default: remap where it works,
    copy-and-grow elsewhere (``kv_note`` says why). ``prefault_lead_tokens`` makes
    copy-and-grow commit its successor's copy target that many tokens before each
    boundary; ``measure_physical`` reads the KV's committed bytes after every step.
    """
    feed = _Feed(forced_ids, max_new_tokens, stop_ids, choose, on_token, keep_logits)
    if isinstance(loader, PagedLoader):
        if kv_layout is not None:
            raise BadRequestError(f"the paged graph keeps its KV in blocks: no {arg('kv_layout')}")
        return _decode_paged(loader, prompt_ids, feed, measure_physical)
    ladder = loader.ladder
    roles = _checked_roles(loader, prompt_ids, max_new_tokens, forced_ids)
    if isinstance(loader, AutoLoader):  # the rungs this request decodes on, and when each builds
        fed = len(forced_ids) if forced_ids is not None else max(max_new_tokens - 1, 0)
        stops = forced_ids is None and (bool(stop_ids) or on_token is not None)
        ladder = loader.begin_request(len(prompt_ids), fed, stops)
    origin = loader.origin_s
    choice = choose_layout(kv_layout or loader.kv_layout, roles, ladder)
    if choice.failover:
        warnings.warn(choice.note, KVLayoutWarning, stacklevel=2)
    first = ladder.rung_for(len(prompt_ids))
    loader.start(first, reachable_tokens(prompt_ids, forced_ids, max_new_tokens))
    prompt_ready_s = time.perf_counter() - origin
    prefault = Prefault(ladder, prefault_lead_tokens) if prefault_lead_tokens else None
    kv = make_kv(choice.layout, roles, first, ladder.top_tokens, prefault, ladder)
    trace = KVTrace(kv, origin, measure_physical)
    chunk = loader.prefill_chunk_tokens or DEFAULT_PREFILL_CHUNK_TOKENS
    if release_passed_rungs is None:
        release_passed_rungs = loader.release_passed_rungs
    release = passed_rungs_released(loader.policy, release_passed_rungs)
    session = DecodeSession(
        roles, ladder, kv, loader, chunk, origin_s=origin, release_passed=release
    )
    try:
        run = feed.run(session, kv, trace, prompt_ids, origin)
    finally:
        try:
            session.close()  # releases what the sequence held back to its end
        finally:
            kv.close()
    rungs = [first] + [b.migration.to_capacity_tokens for b in session.boundaries]
    if isinstance(loader, AutoLoader):
        loader.end_request(rungs[-1], session.steps)
    return DecodeResult(
        prompt_tokens=len(prompt_ids),
        token_ids=run.token_ids,
        rungs=tuple(rungs),
        steps=tuple(session.steps),
        boundaries=tuple(session.boundaries),
        events=tuple(loader.events),
        ready_s=prompt_ready_s,
        first_token_s=run.first_token_s,
        finished_s=run.finished_s,
        reserved_kv=trace.reserved_pairs(),
        logits=run.logits,
        kv_layout=choice.layout.value,
        kv_note=choice.note,
        kv_samples=tuple(trace.samples),
    )


def _decode_paged(
    loader: PagedLoader, prompt_ids: Sequence[int], feed: _Feed, measure_physical: bool
) -> DecodeResult:
    """One sequence on the paged graph: no rung graphs, the KV grown in blocks."""
    ladder = loader.ladder
    check_prompt_ids(prompt_ids, loader.vocab_tokens, ladder.top_tokens, feed.forced_ids or ())
    check_request_fits(ladder, prompt_ids, feed.forced_ids, feed.max_new_tokens)
    origin = loader.origin_s
    first = ladder.rung_for(len(prompt_ids))
    loader.start(first)
    ready_s = time.perf_counter() - origin
    sequence = loader.sequence(
        first, reachable_tokens(prompt_ids, feed.forced_ids, feed.max_new_tokens)
    )
    trace = KVTrace(sequence.kv, origin, measure_physical)
    try:
        run = feed.run(sequence, sequence.kv, trace, prompt_ids, origin)
    finally:
        sequence.close()
    return DecodeResult(
        prompt_tokens=len(prompt_ids),
        token_ids=run.token_ids,
        rungs=(first, *(b.migration.to_capacity_tokens for b in sequence.boundaries)),
        steps=tuple(sequence.steps),
        boundaries=tuple(sequence.boundaries),
        events=tuple(loader.events),
        ready_s=ready_s,
        first_token_s=run.first_token_s,
        finished_s=run.finished_s,
        reserved_kv=trace.reserved_pairs(),
        logits=run.logits,
        kv_layout="paged",
        kv_samples=tuple(trace.samples),
    )


def reachable_tokens(
    prompt_ids: Sequence[int], forced_ids: Sequence[int] | None, max_new_tokens: int
) -> int:
    """The KV positions a request can fill: its prompt and the tokens it feeds back. The
    loader starts no rung above the one holding them."""
    # Greedy decoding never feeds its last token back; teacher forcing feeds them all.
    fed = len(forced_ids) if forced_ids is not None else max(max_new_tokens - 1, 0)
    return len(prompt_ids) + fed


def check_request_fits(
    ladder: Ladder, prompt_ids: Sequence[int], forced_ids: Sequence[int] | None, max_new: int
) -> None:
    """Refuse a request whose KV would outgrow the top rung."""
    fed = reachable_tokens(prompt_ids, forced_ids, max_new) - len(prompt_ids)
    if len(prompt_ids) + fed > ladder.top_tokens:
        raise BadRequestError(
            f"{len(prompt_ids)} prompt tokens and {fed} fed-back tokens need "
            f"{len(prompt_ids) + fed} KV positions, over the top rung {ladder.top_tokens}; "
            f"extend {arg('ladder')} or lower {arg('max_new_tokens')}"
        )


def _checked_roles(
    loader: Loader,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    forced_ids: Sequence[int] | None,
) -> ModelRoles:
    """The model's roles once the request is known to fit the model and the ladder.

    The roles (and the vocabulary) come from memory, a stored blob's record, or the IR:
    the ids are checked before anything compiles.
    """
    if not prompt_ids:
        raise BadRequestError("the prompt is empty; give at least one token id")
    ladder = loader.ladder
    first_guess = Specialization.decode(ladder.rung_for(min(len(prompt_ids), ladder.top_tokens)))
    roles = loader.roles(first_guess)
    check_prompt_ids(prompt_ids, roles.vocab_tokens, ladder.top_tokens, forced_ids or ())
    check_request_fits(ladder, prompt_ids, forced_ids, max_new_tokens)
    return roles


@dataclass(frozen=True)
class _Run:
    """What a sequence's tokens were, and when."""

    token_ids: tuple[int, ...]
    first_token_s: float
    finished_s: float
    logits: dict[int, np.ndarray]


@dataclass(frozen=True)
class _Feed:
    """Where a sequence's tokens come from (forced, or chosen from the logits), which
    logits are kept, and when it stops."""

    forced_ids: Sequence[int] | None
    max_new_tokens: int
    stop_ids: frozenset[int]
    choose: Callable[[np.ndarray], int] | None
    on_token: Callable[[int], object] | None
    keep_logits: Callable[[int, int], bool] | None

    def run(
        self,
        session: DecodeSession | PagedSequence,
        kv: KVCache | BlockKV,
        trace: KVTrace,
        prompt_ids: Sequence[int],
        origin_s: float,
    ) -> _Run:
        kept: dict[int, np.ndarray] = {}
        logits = session.prefill(prompt_ids)
        first_token_s = time.perf_counter() - origin_s
        if self.keep_logits is not None and self.keep_logits(0, kv.live_tokens):
            kept[0] = logits
        trace.record()
        tokens: list[int] = []
        forced = self.forced_ids
        budget = len(forced) if forced is not None else self.max_new_tokens
        for step in range(1, budget + 1):
            if forced is not None:
                token = int(forced[step - 1])
            else:
                token = int(np.argmax(logits)) if self.choose is None else self.choose(logits)
            tokens.append(token)
            stop = bool(self.on_token(token)) if self.on_token is not None else False
            if forced is None and (stop or token in self.stop_ids or step == budget):
                break
            logits = session.step(token)
            trace.record()
            if self.keep_logits is not None and self.keep_logits(step, kv.live_tokens):
                kept[step] = logits
        return _Run(tuple(tokens), first_token_s, time.perf_counter() - origin_s, kept)
