"""The LM head and the embedding cut out of the rung graphs (ir/headcut.py,
compile/sharedhead.py): exactly the uncut model's tokens and logits on the CPU plugin and
the NPU path, keys of their own, one head and one embedding per chunk for a whole ladder."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

import ovspec
from ovspec.compile import sharedhead
from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.modes import LoadMode
from ovspec.compile.sharedhead import (
    EMBEDDING_PREFIX,
    HEAD_SPECIALIZATION,
    HostLookup,
    embedding_chunk,
)
from ovspec.compile.sharedhead import CutCompiledModel as Cut
from ovspec.ir.headcut import EMBEDDING_MODEL_NAME, HEAD_MODEL_NAME, HIDDEN_OUTPUT, host_table
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import GraphRewrite, RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.runtime.decoding import decode
from ovspec.store.local import Store

NPUW = {"NPUW_DEVICES": "CPU"}
EXACT_NPU = {**NPUW, **profile_for("NPU", NPUW).exact_properties}
# device -> (properties, load mode, the rewrites without the cut)
PATHS: dict[str, tuple[dict[str, str], str, RewriteSet]] = {
    "CPU": (dict(EXACT_CPU_PROPERTIES), "compile", profile_for("CPU").default_rewrites),
    "NPU": (EXACT_NPU, "import", profile_for("NPU", NPUW).default_rewrites),
}
HEAD = frozenset({GraphRewrite.SHARED_HEAD})
CUTS = frozenset({GraphRewrite.SHARED_HEAD, GraphRewrite.SHARED_EMBEDDING})


def _with(rewrites: RewriteSet, cuts: frozenset[GraphRewrite]) -> RewriteSet:
    return RewriteSet((rewrites.rewrites - CUTS) | cuts)


@pytest.fixture(params=["qwen2", "llama", "tiny"])
def model_dir(request: pytest.FixtureRequest, tiny_dir: Path) -> Path:
    if request.param == "tiny":
        return tiny_dir
    return Path(__file__).resolve().parents[1] / "data" / str(request.param)


@pytest.mark.parametrize("cuts", [HEAD, CUTS], ids=["head", "head+embedding"])
@pytest.mark.parametrize("device", list(PATHS))
def test_the_cut_decodes_the_uncut_models_tokens_and_logits(
    model_dir: Path, device: str, cuts: frozenset[GraphRewrite], tmp_path: Path
) -> None:
    properties, load_mode, rewrites = PATHS[device]
    reference = model_dir / "reference.npz"
    prompt = [int(t) for t in np.load(reference)["prompt_ids"]] if reference.exists() else [5] * 9
    runs = {}
    for cut in (frozenset[GraphRewrite](), cuts):
        with ovspec.open(
            model_dir,
            ladder="32,64",
            device=device,
            properties=properties,
            store=tmp_path / "store",
            load_mode=load_mode,
            rewrites=_with(rewrites, cut),
        ) as loader:
            runs[cut] = decode(loader, prompt, max_new_tokens=40, keep_logits=lambda *_: True)
    uncut, headed = runs[frozenset()], runs[cuts]
    assert headed.rungs == uncut.rungs == (32, 64)  # a boundary crossed, a prompt graph run
    assert headed.token_ids == uncut.token_ids
    assert headed.logits.keys() == uncut.logits.keys() and uncut.logits
    worst = max(float(np.abs(headed.logits[s] - uncut.logits[s]).max()) for s in uncut.logits)
    # The same nodes on the same rows: exact, but NPUW's graphs without their embedding
    # lookup round differently (~5e-6, docs/npu.md).
    assert worst == 0.0 or (device == "NPU" and cuts == CUTS and worst < 2e-5)


def test_the_cut_graphs_and_their_parts_have_keys_of_their_own(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    properties, _, rewrites = PATHS["NPU"]
    store = Store(tmp_path / "store")
    specs = [Specialization.decode(32), Specialization.prefill(32, 16)]
    graphs, parts = [], []
    for cuts in (frozenset[GraphRewrite](), HEAD, CUTS):
        compiler = Compiler(
            ModelDir.open(qwen2_dir), "NPU", properties, store, rewrites=_with(rewrites, cuts)
        )
        try:
            graphs += [compiler.key(s).hex for s in specs]
            labels = (HEAD_SPECIALIZATION, f"{EMBEDDING_PREFIX}1", f"{EMBEDDING_PREFIX}16")
            parts += [compiler.part_key(label).hex for label in labels]
        finally:
            compiler.close()
    # Each cut changes every graph's key; the head and each embedding are entries of
    # their own (keyed with the rewrite set too: a recompile, never a wrong blob).
    assert len(set(graphs)) == len(graphs) and not set(graphs) & set(parts)
    assert len(set(parts)) == len(parts)


class _CountingCore:
    """A Core that counts the models it compiles, by name."""

    def __init__(self, core: ov.Core) -> None:
        self._core = core
        self.compiles: Counter[str] = Counter()

    def compile_model(self, model: ov.Model, *args: Any) -> ov.CompiledModel:
        self.compiles[model.get_friendly_name()] += 1
        return self._core.compile_model(model, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


@pytest.mark.parametrize("device", list(PATHS))
@pytest.mark.parametrize("host", [True, False], ids=["host-lookup", "lookup-models"])
def test_a_ladder_compiles_its_head_once_and_an_embedding_per_chunk(
    tiny_dir: Path, tmp_path: Path, device: str, host: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head: one model for the ladder. The embedding: the host's lookup over one table
    (tiny's is an f16 constant), or, for a table the host cannot read as rows (made so
    here), one lookup model per chunk."""
    if not host:
        monkeypatch.setattr(sharedhead, "host_table", lambda *_: None)
    properties, load_mode, rewrites = PATHS[device]
    store = Store(tmp_path / "store")
    compiler = Compiler(
        ModelDir.open(tiny_dir),
        device,
        properties,
        store,
        rewrites=_with(rewrites, CUTS),
        load_mode=LoadMode(load_mode),
    )
    counting = _CountingCore(compiler.core)
    compiler.core = counting  # type: ignore[assignment]
    try:
        specs = [Specialization.decode(c) for c in (32, 64, 128, 256)]
        programs = [compiler.load(s) for s in [Specialization.prefill(32, 16), *specs]]
        cut = [p.compiled for p in programs if isinstance(p.compiled, Cut)]
        assert len(cut) == len(programs)
        assert all(HIDDEN_OUTPUT in {n for p in c.body.outputs for n in p.names} for c in cut)
        heads = {id(c.head) for c in cut}
        # Each chunk's lookup, by the chunk its graphs take (CPU's 1..P prompt graph keeps
        # its lookup: its chunk varies).
        lookups = {embedding_chunk(c.body): c.embedding for c in cut if c.embedding}
        assert 1 in lookups and all(embedding_chunk(c.body) in lookups for c in cut[1:])
        kinds = {type(lookup) for lookup in lookups.values()}
        assert kinds == ({HostLookup} if host else {ov.CompiledModel})
        if host:  # every lookup reads the one table, where the IR's constant lies
            assert len({id(lookup.table) for lookup in lookups.values()}) == 1
    finally:
        compiler.close()
    assert counting.compiles[HEAD_MODEL_NAME] == 1 and len(heads) == 1
    models = 0 if host else len(lookups)
    assert counting.compiles[EMBEDDING_MODEL_NAME] == models
    assert len({id(lookup) for lookup in lookups.values()}) == len(lookups)
    stored = [e.values()["specialization"] for e in store.entries()]
    assert stored.count(HEAD_SPECIALIZATION) == (1 if load_mode == "import" else 0)
    in_store = sorted(
        int(s[len(EMBEDDING_PREFIX) :]) for s in stored if s.startswith(EMBEDDING_PREFIX)
    )
    assert in_store == (sorted(lookups) if load_mode == "import" and not host else [])


def _lookup_model(table: ov.Node, ids_count: int) -> tuple[ov.Model, Any]:
    ids = ops.parameter([1, ids_count], ov.Type.i64)
    ids.output(0).get_tensor().set_names({"input_ids"})
    gather = ops.gather(table, ids, ops.constant(np.int64(0)))
    return ov.Model([ops.result(gather)], [ids]), SimpleNamespace(input_ids="input_ids")


def test_the_host_lookup_gives_what_the_cpu_plugins_gather_does_ids_out_of_range_too() -> None:
    rows = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float16)
    ids = np.array([[3, -1, 9, 0, 12, -11]], dtype=np.int64)
    model, roles = _lookup_model(ops.convert(ops.constant(rows), ov.Type.f32), ids.shape[1])
    table = host_table(model, roles)  # type: ignore[arg-type]
    assert table is not None and table.out_dtype == np.float32
    assert np.shares_memory(table.rows, table.owner.get_data())  # the constant's bytes
    request = HostLookup(table, ids.shape[1]).create_infer_request()
    request.get_tensor("input_ids").data[...] = ids
    request.infer()
    compiled = ov.Core().compile_model(model, "CPU", dict(EXACT_CPU_PROPERTIES))
    expected = compiled({"input_ids": ids})[0]
    assert np.array_equal(request.get_output_tensor(0).data, expected)
    assert np.array_equal(expected[0, :4], rows[[3, 9, 9, 0]].astype(np.float32))
    assert not expected[0, 4:].any()  # out of range: zeros, on both


def test_a_table_that_is_not_plain_rows_stays_a_lookup_model() -> None:
    rows = np.arange(40, dtype=np.uint8).reshape(10, 4)
    half = ops.constant(np.float32(0.5))
    scaled = ops.multiply(ops.convert(ops.constant(rows), ov.Type.f32), half)
    model, roles = _lookup_model(scaled, 3)
    assert host_table(model, roles) is None  # type: ignore[arg-type]
    model, roles = _lookup_model(ops.constant(rows.astype(np.float32)), 3)
    assert host_table(model, roles) is not None  # type: ignore[arg-type]


def test_a_part_made_here_is_served_by_the_import_that_validated_it(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """A cold store imports each blob once, as a warm one does: a second import would
    hold the part's weights twice where NPUW's named weights bank keeps every import's."""
    properties, load_mode, rewrites = PATHS["NPU"]
    store = Store(tmp_path / "store")
    imports: list[int] = []
    for _ in ("cold", "warm"):
        compiler = Compiler(
            ModelDir.open(tiny_dir),
            "NPU",
            properties,
            store,
            rewrites=_with(rewrites, HEAD),
            load_mode=LoadMode(load_mode),
        )
        seen = 0
        real_import = compiler._import

        def counting_import(*args: Any, _real: Any = real_import) -> Any:
            nonlocal seen
            seen += 1
            return _real(*args)

        compiler._import = counting_import  # type: ignore[method-assign]
        try:
            program = compiler.load(Specialization.decode(32))
            assert isinstance(program.compiled, Cut) and program.compiled.head is not None
        finally:
            compiler.close()
        imports.append(seen)
    assert imports == [2, 2]  # the rung's graph and the head, cold and warm
