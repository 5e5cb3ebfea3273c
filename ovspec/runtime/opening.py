"""Opening a model as a lazy loader: options in, a ``Loader`` that owns what it opened.

``decide`` turns the user's options and the tuning into what to do (the device
profile's defaults applied, the split's constraints checked) before anything opens;
``open_loader`` then opens the store, the build delegate, the compiler, the weight-page
helpers and the loader in order, and hands everything it opened to the loader on one
``ExitStack``: a failure on the way closes what was opened, in reverse.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import openvino as ov

from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import DeviceProfile, profile_for
from ovspec.compile.modes import LoadMode
from ovspec.compile.split import (
    THREADS_PROPERTY,
    CoreSplit,
    HostBuilder,
    SplitPins,
    pin_process,
    usable_cores,
)
from ovspec.errors import BadRequestError, arg
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir, resolve_model
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.runtime.autopolicy import Lanes
from ovspec.runtime.autorun import AutoLoader
from ovspec.runtime.kv import choose_layout
from ovspec.runtime.loader import Loader, Policy
from ovspec.runtime.options import OpenOptions, Tuning
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.residency import (
    WeightPageTrimmer,
    WeightPrefault,
    serve_host_builds_trimmed,
)
from ovspec.store.local import Store
from ovspec.store.remote import Remote, RemoteConfig, open_remote


@dataclass(frozen=True)
class Decisions:
    """What ``open_loader`` does for one set of options and tuning."""

    profile: DeviceProfile
    properties: dict[str, str]  # what the compiler compiles and imports with
    load_mode: LoadMode
    rewrites: RewriteSet
    cores: CoreSplit | None  # the device/host split
    trim_weight_pages: bool
    host_trims_weight_pages: bool  # the split's host build process, which reads the IR
    halve_prompt_graph: bool
    warm_first_rung: bool  # a request's first rung, as it loads (beside the prompt's run)


def decide(options: OpenOptions, tuning: Tuning) -> Decisions:
    """The device profile's defaults applied to ``options``; refuses a combination that
    cannot run (the split compiles on the host: it needs the import load mode)."""
    profile = profile_for(options.device, options.properties)
    properties = profile.loader_properties(options.properties)
    mode = options.load_mode
    cores = tuning.cores
    if cores is not None:
        if mode in (LoadMode.COMPILE, LoadMode.PAGED):
            raise BadRequestError(
                f"{arg('split')} builds on the host and imports here: it needs "
                f"{arg('load_mode', 'import')}, not {mode.value}"
            )
        mode = LoadMode.IMPORT
        properties = {THREADS_PROPERTY: str(len(cores.device)), **properties}
    if mode is None:
        mode = (
            profile.rung_load_mode
            if _asks_for_rungs(options, tuning)
            else profile.default_load_mode
        )
    if mode is LoadMode.PAGED:
        if not profile.runs_paged_attention:
            raise BadRequestError(
                f"{arg('load_mode', 'paged')} needs a device that runs PagedAttention (the CPU "
                f"plugin); {options.device} takes load_mode='import'"
            )
        # One graph, compiled before the prompt: no second thread compiles beside decode.
        properties = profile.required_properties(options.properties)
    return Decisions(
        profile=profile,
        properties=properties,
        load_mode=mode,
        rewrites=options.rewrites if options.rewrites is not None else profile.default_rewrites,
        cores=cores,
        trim_weight_pages=_trims_weight_pages(tuning.trim_weight_pages, profile, mode, cores),
        host_trims_weight_pages=cores is not None
        and _trims_weight_pages(tuning.trim_weight_pages, profile, mode, None),
        halve_prompt_graph=_halves_prompt_graph(
            tuning.halve_prompt_graph, profile, mode, options.policy
        ),
        warm_first_rung=profile.warms_first_rung
        if tuning.warm_first_rung is None
        else tuning.warm_first_rung,
    )


def _asks_for_rungs(options: OpenOptions, tuning: Tuning) -> bool:
    """Whether ``options`` name something only rung graphs have: a KV layout, weight
    compression, graph rewrites, the prompt graph's halves, trimmed weight pages, a
    window plan or auto's costs."""
    return (
        options.kv_layout is not None
        or options.compression is not None
        or options.rewrites is not None
        or bool(tuning.halve_prompt_graph)
        or bool(tuning.trim_weight_pages)
        or tuning.window_plan is not None
        or tuning.auto_costs is not None
    )


def open_loader(options: OpenOptions, tuning: Tuning | None = None) -> Loader | PagedLoader:
    """A lazy loader for ``options`` (see ``ovspec.open``), owning what it opened."""
    tuning = tuning or Tuning()
    decided = decide(options, tuning)
    if decided.load_mode is LoadMode.PAGED:
        return _paged_loader(options, decided, tuning)
    cores = decided.cores
    with contextlib.ExitStack() as stack:
        store = _store(options, stack)
        model_dir = resolve_model(str(options.model), store.models_folder)
        options.ladder.check_fits(model_dir.max_position_embeddings)
        builder = None
        if cores is not None:
            # Spawned now: its Python and OpenVINO start while this process opens the
            # device (a device the compiler refuses then stops it at once).
            builder = _host_builder(options, decided, model_dir, store, cores).spawn()
            stack.callback(builder.close)
        compiler = Compiler(
            model_dir,
            options.device,
            decided.properties,
            store,
            compression=options.compression,
            blob_mode=options.blob_mode,
            rewrites=decided.rewrites,
            load_mode=decided.load_mode,
            rung_chunk_tokens=options.prefill_chunk_tokens,
            delegate=builder,
        )
        stack.callback(compiler.close)  # and the IR it may be reading ahead
        if cores is None:  # under the split OpenVINO's pinning keeps inference on the device
            decided.profile.configure_loader_core(compiler.core, decided.properties)
        if options.kv_layout is not None:  # a ladder the layout refuses: before any compile
            top = Specialization.decode(options.ladder.top_tokens)
            choose_layout(options.kv_layout, compiler.roles(top), options.ladder)
        trimmer = _weight_pages(decided, options.policy, compiler, model_dir, stack)
        pins = None
        if builder is not None and cores is not None:
            # OpenVINO has started with the whole mask (the compiler listed the devices),
            # which a thread entering its pool gets again; the loader pins when its
            # foreground is over, and closing restores this affinity.
            stack.callback(pin_process, tuple(sorted(os.sched_getaffinity(0))))
            builder.start()
            pins = SplitPins(cores, threading.get_native_id())  # the thread that opens decodes
        owned = contextlib.ExitStack()
        loader = _loader_class(options, tuning)(
            compiler,
            options.ladder,
            prefill_chunk_tokens=options.prefill_chunk_tokens,
            window_plan=tuning.window_plan,
            on_close=(owned.close,),
            origin_s=tuning.origin_s,
            kv_layout=options.kv_layout,
            worker_cores=cores.host if cores is not None else None,
            pins=pins,
            # Not during a lazy start that compiles: the first graph packs its weights
            # from the mapping then, and dropping its pages meanwhile slows the first
            # prefill (an import-mode start calls it as it ends: Loader.start).
            on_steady=trimmer.start if trimmer is not None else None,
            halve_prompt_graph=decided.halve_prompt_graph,
            warm_first_rung=decided.warm_first_rung,
            release_passed_rungs=tuning.release_passed_rungs,
        )
        owned.push(stack.pop_all())  # the loader closes them from now on
    return loader


def _loader_class(options: OpenOptions, tuning: Tuning) -> Callable[..., Loader]:
    """The policy's loader: ``auto`` runs its own (costs from the tuning; lanes: one host
    build at a time under the split, else by the cores)."""
    if options.policy is not Policy.AUTO:
        return functools.partial(Loader, policy=options.policy)
    cores = tuning.cores
    lanes = Lanes.for_cores(len(usable_cores()), split=cores is not None)
    return functools.partial(AutoLoader, costs=tuning.auto_costs, lanes=lanes)


def rung_loader(loader: Loader | PagedLoader, what: str) -> Loader:
    """``loader`` as a loader of rung graphs; a paged one is closed and refused for
    ``what`` (work that measures rungs)."""
    if isinstance(loader, PagedLoader):
        loader.close()
        raise BadRequestError(f"{what} {arg('load_mode', 'paged')} has no rungs")
    return loader


def _paged_loader(options: OpenOptions, decided: Decisions, tuning: Tuning) -> PagedLoader:
    """The paged graph's loader: the store only resolves the model (no blobs); ``decide``
    refused the split and the halves, which tune rung graphs."""
    if options.kv_layout is not None:
        raise BadRequestError(
            f"{arg('load_mode', 'paged')} keeps its KV in blocks: leave {arg('kv_layout')} unset"
        )
    if options.compression is not None or options.rewrites is not None:
        raise BadRequestError(
            f"{arg('load_mode', 'paged')} compiles the IR's own weights and graph: weight "
            f"compression and rewrites shape rung graphs ({arg('load_mode', 'compile')})"
        )
    with contextlib.ExitStack() as stack:
        store = _store(options, stack)
        model_dir = resolve_model(str(options.model), store.models_folder)
        options.ladder.check_fits(model_dir.max_position_embeddings)
        loader = PagedLoader(
            model_dir.xml_path,
            options.ladder,
            options.device,
            decided.properties,
            options.prefill_chunk_tokens,
            origin_s=tuning.origin_s,
            on_close=(stack.pop_all().close,),
            model_dir=model_dir,
            store=store,
            halve_graph=len(usable_cores()) >= 2,
        )
    # The IR is read and transformed on a thread while the device and the properties are
    # checked (refused here as a rung compile would refuse them); its compile then runs
    # while the caller prepares its request.
    loader.read_ahead()
    try:
        decided.profile.resolve(ov.Core(), decided.properties)
    except BaseException:
        loader.close()
        raise
    loader.compile_ahead()
    return loader


def _store(options: OpenOptions, stack: contextlib.ExitStack) -> Store:
    if isinstance(options.store, Store):
        return options.store  # the caller's: it closes it
    store = Store(options.store or Store.default_root(), remote=_remote(options.remote))
    stack.callback(store.close)
    return store


def _remote(remote: Remote | RemoteConfig | None) -> Remote | None:
    if isinstance(remote, Remote):
        return remote
    config = remote if remote is not None else RemoteConfig.from_env()
    return open_remote(config) if config is not None else None


def _host_builder(
    options: OpenOptions, decided: Decisions, model_dir: ModelDir, store: Store, cores: CoreSplit
) -> HostBuilder:
    return HostBuilder(
        model_root=model_dir.root,
        models_folder=store.models_folder,
        device=options.device,
        properties=decided.properties,
        store_root=store.root,
        compression=str(options.compression or Compression()),
        blob_mode=options.blob_mode.value,
        rewrites=decided.rewrites.canonical,
        host_cores=cores.host,
        serve=serve_host_builds_trimmed if decided.host_trims_weight_pages else None,
    )


def _weight_pages(
    decided: Decisions,
    policy: Policy,
    compiler: Compiler,
    model_dir: ModelDir,
    stack: contextlib.ExitStack,
) -> WeightPageTrimmer | None:
    """The trimmer the loader starts when it is steady, and the prefault that maps the
    weights' pages in while the first graph compiles (not for an eager start, whose
    trimmer drops pages from its beginning). Both stop before the compiler closes: it
    holds the weight their anchor points into."""
    if not decided.trim_weight_pages:
        return None
    trimmer = WeightPageTrimmer.for_weights(model_dir.bin_path, compiler.mapped_weights_address)
    if policy is not Policy.EAGER:
        address = functools.partial(compiler.mapped_weights_address, wait=True)
        prefault = WeightPrefault(model_dir.bin_path, address)
        prefault.start()
        stack.callback(prefault.stop)
    stack.callback(trimmer.stop)
    return trimmer


def _trims_weight_pages(
    asked: bool | None, profile: DeviceProfile, mode: LoadMode, cores: CoreSplit | None
) -> bool:
    reason = WeightPageTrimmer.unsupported_reason()
    if asked and reason is not None:
        raise BadRequestError(f"{arg('trim_weight_pages')} cannot run here: {reason}")
    if asked is None:
        # Import mode too, where this process compiles its cold store's blobs from the IR;
        # under the split a host process builds them and this one never reads the IR.
        from_ir = mode is LoadMode.COMPILE or (mode is LoadMode.IMPORT and cores is None)
        return reason is None and profile.trims_weight_pages and from_ir
    return asked


def _halves_prompt_graph(
    asked: bool | None, profile: DeviceProfile, mode: LoadMode, policy: Policy
) -> bool:
    if asked and (mode is not LoadMode.COMPILE or policy is Policy.EAGER):
        why = (
            f"{arg('load_mode', mode.value)} does not compile rung graphs from the IR; "
            "use load_mode='compile'"
            if mode is not LoadMode.COMPILE
            else "an eager start compiles two graphs at once already; use a lazy policy"
        )
        raise BadRequestError(f"{arg('halve_prompt_graph')} cannot apply: {why}")
    if asked is None:
        return (
            profile.halves_prompt_graph
            and mode is LoadMode.COMPILE
            and policy is not Policy.EAGER
            and len(usable_cores()) >= 2
        )
    return asked
