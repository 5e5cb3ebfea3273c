"""ovspec.open + decode: greedy tokens equal the original stateful model's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest

import ovspec
from ovspec.compile.halves import HalvedCompiledModel
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.ir.specialize import Specialization
from ovspec.runtime.decoding import Tuning, decode
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import EventKind, Loader, Policy
from ovspec.store.local import Store

# Rung graphs compiled from the IR with every policy; the store path (NPU's, a CPU
# option) too: its CPU graphs carry the live-tokens state through export and import.
# (CPU's default, the paged graph, is tests/runtime/test_paged.py's.)
CASES = [(policy, "compile") for policy in Policy] + [(Policy.ONE_AHEAD, "import")]


@pytest.mark.parametrize(("policy", "load_mode"), CASES, ids=[f"{p.value}-{m}" for p, m in CASES])
def test_greedy_equals_the_stateful_model(
    fixture_dir: Path, store: Store, policy: Policy, load_mode: str
) -> None:
    prompt = [int(t) for t in np.load(fixture_dir / "reference.npz")["prompt_ids"]]
    control = StatefulRunner(
        ov.Core().read_model(fixture_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    )
    expected = control.greedy(prompt, 100)
    with ovspec.open(
        fixture_dir,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        policy=policy,
        prefill_chunk_tokens=8,
        load_mode=load_mode,
    ) as loader:
        result = decode(loader, prompt, max_new_tokens=100)
    assert list(result.token_ids) == expected
    hits_or_builds = {EventKind.STORE_HIT, EventKind.COMPILED} & {e.kind for e in result.events}
    assert (store.stats().entries > 0) == (load_mode == "import") and hits_or_builds
    assert result.rungs == (32, 64, 128)
    assert [b.at_live_tokens for b in result.boundaries] == [32, 64]
    background = [e for e in result.events if e.kind is EventKind.LOAD_START and not e.foreground]
    # auto without costs runs one ahead
    assert bool(background) == (policy in (Policy.ONE_AHEAD, Policy.AUTO))


def test_builtin_model_shared_max_layout(tiny_dir: Path, store: Store) -> None:
    rng = np.random.default_rng(11)
    prompt = rng.integers(3, 2048, 40).tolist()
    control = StatefulRunner(
        ov.Core().read_model(tiny_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    )
    expected = control.greedy(prompt, 60)
    with ovspec.open(
        tiny_dir,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        policy="eager",
        prefill_chunk_tokens=16,
        load_mode="compile",
    ) as loader:
        result = decode(loader, prompt, max_new_tokens=60, kv_layout=KVLayout.SHARED_MAX)
    assert list(result.token_ids) == expected
    assert result.rungs == (64, 128)  # a 40-token prompt starts on the 64 rung
    # Shared-max reserves the top rung from the start and never allocates again (its
    # dense views re-stride the live KV inside the one buffer).
    assert {bytes_ for _, bytes_ in result.reserved_kv} == {128 * 512}
    assert all(b.migration.allocated_bytes == 0 for b in result.boundaries)


def test_teacher_forcing_keeps_the_logits_asked_for(qwen2_dir: Path, store: Store) -> None:
    forced = list(range(100, 140))
    with ovspec.open(
        qwen2_dir, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=store
    ) as loader:
        result = decode(
            loader,
            [5, 6, 7],
            forced_ids=forced,
            keep_logits=lambda step, live: live in (31, 32, 33),
        )
    assert result.token_ids == tuple(forced)
    assert sorted(result.logits) == [28, 29, 30]
    assert result.first_token_s <= result.finished_s


def test_a_request_over_the_top_rung_is_refused(qwen2_dir: Path, store: Store) -> None:
    with (
        ovspec.open(qwen2_dir, ladder="32", store=store) as loader,
        pytest.raises(BadRequestError, match="over the top rung 32"),
    ):
        decode(loader, list(range(30)), max_new_tokens=10)


def test_cpu_pinning_is_off_unless_asked() -> None:
    from ovspec.runtime.decoding import loader_properties

    assert loader_properties("CPU", {}) == {"ENABLE_CPU_PINNING": "NO"}
    asked = {"ENABLE_CPU_PINNING": "YES"}
    assert loader_properties("CPU", asked) == asked
    assert loader_properties("NPU", {}) == {}


def test_a_sequence_releases_the_rungs_it_has_left(qwen2_dir: Path, store: Store) -> None:
    with _cpu_ladder(qwen2_dir, store, policy="eager") as loader:
        result = decode(loader, list(range(5, 21)), max_new_tokens=40, release_passed_rungs=True)
        released = [e.spec for e in result.events if e.kind is EventKind.RELEASED]
        assert released == ["prefill@32x8", "decode@32"]
        assert loader.program(Specialization.decode(32)) is None
        assert loader.program(Specialization.decode(64)) is not None  # the current rung
        kept = decode(loader, list(range(5, 21)), max_new_tokens=40, release_passed_rungs=False)
        assert kept.token_ids == result.token_ids  # re-imported from the store
        assert loader.program(Specialization.decode(32)) is not None


@pytest.mark.parametrize(("policy", "releases"), [("eager", False), ("one_ahead", True)])
def test_the_policy_decides_whether_passed_rungs_go(
    qwen2_dir: Path, store: Store, policy: str, releases: bool
) -> None:
    """By default an eager loader keeps every rung it built (the next sequence needs them
    and a release stalls the decode); a lazy one drops what the sequence has left."""
    with _cpu_ladder(qwen2_dir, store, policy=policy) as loader:
        result = decode(loader, list(range(5, 21)), max_new_tokens=40)
        assert result.rungs == (32, 64)
        released = [e.spec for e in result.events if e.kind is EventKind.RELEASED]
        assert ("decode@32" in released) is releases
        assert (loader.program(Specialization.decode(32)) is None) is releases
        again = decode(loader, list(range(5, 21)), max_new_tokens=40)
        assert again.token_ids == result.token_ids
        since = again.events[len(result.events) :]  # a loader's events accumulate
        rebuilt = [e.spec for e in since if e.kind is EventKind.COMPILED and e.seconds > 0]
        assert bool(rebuilt) is releases


def test_the_rung_left_at_the_last_boundary_goes_after_the_last_token(
    qwen2_dir: Path, store: Store
) -> None:
    """A release stalls the decode, so a lazy loader drops a passed rung at its boundary
    only when a successor will load; past the top boundary it waits for the end."""
    with _cpu_ladder(qwen2_dir, store) as loader:
        result = decode(loader, list(range(5, 21)), max_new_tokens=100)
    assert result.rungs == (32, 64, 128)
    released = {e.spec: e.at_s for e in result.events if e.kind is EventKind.RELEASED}
    into_64, into_128 = result.boundaries
    assert into_64.began_s <= released["decode@32"] <= into_128.began_s
    assert released["decode@64"] >= result.finished_s


def test_a_warm_start_never_reads_the_ir(
    qwen2_dir: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    # The store path (CPU's default compiles from the IR).
    with _cpu_ladder(qwen2_dir, store, load_mode="import") as loader:
        cold = decode(loader, prompt, max_new_tokens=100)

    def no_prepare(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a warm start must take the roles from the stored blobs")

    monkeypatch.setattr("ovspec.compile.preparing.prepare_model", no_prepare)
    with _cpu_ladder(qwen2_dir, store, load_mode="import") as loader:
        warm = decode(loader, prompt, max_new_tokens=100)
    assert warm.token_ids == cold.token_ids
    hits = [e for e in warm.events if e.kind is EventKind.STORE_HIT]
    assert len(hits) == 4  # prefill@32x8 and decode@32, 64, 128


def test_the_prompt_runs_while_the_first_decode_graph_loads(qwen2_dir: Path, store: Store) -> None:
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    with ovspec.open(
        qwen2_dir,
        ladder="32,64",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        prefill_chunk_tokens=8,
        load_mode="import",  # a decode graph of its own (CPU's default shares one)
    ) as loader:
        result = decode(loader, prompt, max_new_tokens=20)
    starts = {e.spec: e for e in result.events if e.kind is EventKind.LOAD_START}
    # The first rung's decode graph loads on the worker (its load is first-rung work,
    # marked foreground), and the successor is queued only by the first decode step,
    # after the prompt and after the prefill graph was released.
    assert starts["decode@32"].foreground and not starts["decode@64"].foreground
    released = next(e for e in result.events if e.kind is EventKind.RELEASED)
    assert released.spec.startswith("prefill@") and released.at_s <= starts["decode@64"].at_s
    prefill_loaded = next(
        e.at_s for e in result.events if e.kind is EventKind.LOADED and e.spec.startswith("pre")
    )
    assert prefill_loaded <= result.ready_s <= result.first_token_s


@pytest.mark.parametrize(("policy", "option"), [("eager", True), ("one_ahead", False)])
def test_the_loader_option_decides_over_the_policy_and_decode_over_it(
    qwen2_dir: Path, store: Store, policy: str, option: bool
) -> None:
    """``Tuning.release_passed_rungs`` turns the policy's default around; a ``decode``
    that says otherwise wins."""
    tuning = Tuning(release_passed_rungs=option)
    with _cpu_ladder(qwen2_dir, store, policy=policy, tuning=tuning) as loader:
        assert loader.release_passed_rungs is option
        result = decode(loader, list(range(5, 21)), max_new_tokens=40)
        assert result.rungs == (32, 64)
        released = [e.spec for e in result.events if e.kind is EventKind.RELEASED]
        assert ("decode@32" in released) is option
        assert (loader.program(Specialization.decode(32)) is None) is option
        told = decode(
            loader, list(range(5, 21)), max_new_tokens=40, release_passed_rungs=not option
        )
        since = [e.spec for e in told.events[len(result.events) :] if e.kind is EventKind.RELEASED]
        assert ("decode@32" in since) is not option


def _cpu_ladder(model_dir: Path, store: Store, **options: Any) -> Loader:
    """A CPU loader of rung graphs over 32,64,128 with 8-token prefill chunks, compiled
    from the IR unless ``options`` (``ovspec.open``'s keywords) say otherwise."""
    options.setdefault("load_mode", "compile")
    return ovspec.open(
        model_dir,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        prefill_chunk_tokens=8,
        **options,
    )


def _stateful(model_dir: Path) -> StatefulRunner:
    core = ov.Core()
    return StatefulRunner(
        core.read_model(model_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    )


def test_cpu_compiles_the_prompts_rung_as_one_graph_and_later_rungs_static(
    qwen2_dir: Path, store: Store
) -> None:
    """CPU's default: each rung compiled from the IR, the prompt's rung decoding on its
    prefill graph and later rungs on static decode graphs of their own; the store is
    never read nor written (DESIGN.md §10.15)."""
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    expected = _stateful(qwen2_dir).greedy(prompt, 60)
    with _cpu_ladder(qwen2_dir, store) as loader:
        result = decode(loader, prompt, max_new_tokens=60, release_passed_rungs=False)
        prefill = loader.program(Specialization.prefill(32, 8))
        decode32 = loader.program(Specialization.decode(32))
        assert prefill is not None and decode32 is not None
        assert decode32.compiled is prefill.compiled and decode32.reused
        inputs = {port.get_any_name() for port in prefill.compiled.inputs}
        assert "attention_mask" not in inputs  # the live-tokens state builds it
        assert prefill.compiled.input("input_ids").get_partial_shape().is_dynamic  # 1..P
        decode64 = loader.program(Specialization.decode(64))
        assert decode64 is not None and not decode64.reused
        assert decode64.compiled.input("input_ids").get_partial_shape().is_static  # 1 token
        assert loader.program(Specialization.prefill(64, 8)) is None
    assert list(result.token_ids) == expected
    kinds = {e.kind for e in result.events}
    assert EventKind.STORE_HIT not in kinds and EventKind.COMPILED in kinds
    # The worker stays idle at start: decode@32 is the prefill graph, taken before the
    # prompt runs, without a compile or a warm-up.
    prefill_in = next(e for e in result.events if e.kind is EventKind.LOADED)
    decode_in = next(
        e for e in result.events if e.kind is EventKind.LOADED and e.spec == "decode@32"
    )
    assert prefill_in.spec == "prefill@32x8" and decode_in.at_s <= result.ready_s
    assert "warm-up 0.000 s" in decode_in.note
    assert store.stats().entries == 0


def test_a_later_prompt_on_a_static_rung_keeps_its_graph(qwen2_dir: Path, store: Store) -> None:
    """A loader serving two sequences: the first ends on rung 64, whose decode graph is
    static; the second's prompt starts on 64, so it gets a prefill graph of its own and
    keeps decoding on the static graph (not the slower 1..P one), with the right tokens."""
    runner = _stateful(qwen2_dir)
    first_prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    second_prompt = [int(t) % 1000 + 3 for t in range(40)]  # 40 tokens: rung 64
    with _cpu_ladder(qwen2_dir, store) as loader:
        first = decode(loader, first_prompt, max_new_tokens=40, release_passed_rungs=False)
        assert first.rungs[-1] == 64
        static64 = loader.program(Specialization.decode(64))
        assert static64 is not None
        second = decode(loader, second_prompt, max_new_tokens=20, release_passed_rungs=False)
        assert loader.program(Specialization.decode(64)) is static64
        prefill64 = loader.program(Specialization.prefill(64, 8))
        assert prefill64 is not None and prefill64.compiled is not static64.compiled
    assert list(first.token_ids) == runner.greedy(first_prompt, 40)
    assert list(second.token_ids) == runner.greedy(second_prompt, 20)


def test_cpu_compiles_each_rung_once_when_passed_rungs_are_released(
    qwen2_dir: Path, store: Store
) -> None:
    """The default path: the session releases the prefill graph after the prompt, and the
    rung's decode (the same graph) must not compile it again."""
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    with _cpu_ladder(qwen2_dir, store) as loader:
        result = decode(loader, prompt, max_new_tokens=60)
    compiles = [e for e in result.events if e.kind is EventKind.COMPILED and e.seconds > 0]
    assert sorted(e.spec for e in compiles) == ["decode@128", "decode@64", "prefill@32x8"]
    assert result.rungs == (32, 64, 128)


def test_the_prompts_graph_compiles_in_two_halves_and_decodes_the_same_tokens(
    qwen2_dir: Path, store: Store
) -> None:
    """A lazy CPU start compiles the graph the prompt waits for as two halves side by
    side (a CPU compile is one thread); successors compile whole, beside the decode."""
    prompt = [int(t) for t in np.load(qwen2_dir / "reference.npz")["prompt_ids"]]
    expected = _stateful(qwen2_dir).greedy(prompt, 60)
    for halves in (True, False):
        with _cpu_ladder(qwen2_dir, store, tuning=Tuning(halve_prompt_graph=halves)) as loader:
            assert loader.halve_prompt_graph is halves
            result = decode(loader, prompt, max_new_tokens=60, release_passed_rungs=False)
            first = loader.program(Specialization.prefill(32, 8))
            later = loader.program(Specialization.decode(64))
            assert first is not None and later is not None
            assert isinstance(first.compiled, HalvedCompiledModel) is halves
            assert not isinstance(later.compiled, HalvedCompiledModel)
        assert list(result.token_ids) == expected
        notes = [e.note for e in result.events if e.kind is EventKind.COMPILED]
        assert notes.count("as two halves side by side") == int(halves)


@pytest.mark.parametrize("options", [{"load_mode": "import"}, {"policy": "eager"}])
def test_halving_is_refused_where_it_cannot_apply(
    qwen2_dir: Path, store: Store, options: dict[str, str]
) -> None:
    with pytest.raises(BadRequestError, match="halve_prompt_graph"):
        _cpu_ladder(qwen2_dir, store, tuning=Tuning(halve_prompt_graph=True), **options)


@pytest.mark.parametrize(
    ("cores", "options", "expected"),
    [
        ({0, 1}, {}, True),
        ({0}, {}, False),  # one core: nothing to compile the other half on
        ({0, 1}, {"policy": "eager"}, False),  # eager compiles two graphs at once
        ({0, 1}, {"load_mode": "import"}, False),  # graphs come from blobs
    ],
)
def test_halving_is_the_default_for_a_lazy_cpu_start_on_two_cores(
    qwen2_dir: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    cores: set[int],
    options: dict[str, str],
    expected: bool,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    with _cpu_ladder(qwen2_dir, store, **options) as loader:
        assert loader.halve_prompt_graph is expected
