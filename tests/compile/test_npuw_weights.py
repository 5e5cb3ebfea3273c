"""The NPU path's weights held once, in the store and in a process: NPUW's weightless blobs
(a ladder stores the .bin once, not once per blob), each naming the model's one weights
bank, which holds the weights once for every rung imported in a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.devices.npuw import FOLD, WEIGHTS_BANK
from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import ModelDir, resolve_model
from ovspec.ir.rewrites import GraphRewrite, RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.runtime.decoding import Tuning, decode, open_rungs
from ovspec.store.local import Store

# Not the exact properties: those turn folding off (f32 weights would become f16); the
# built-in models' weights are f16 already, so folding keeps their values.
NPUW = {"NPUW_DEVICES": "CPU", "NPUW_F16IC": "NO", "INFERENCE_PRECISION_HINT": "f32"}
LADDER = (64, 128, 256, 512)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:small: 20 MB of f16 weights, so weights dominate a blob and a rung."""
    return resolve_model("builtin:small", tmp_path_factory.mktemp("models")).root


def _logits(compiler: Compiler, spec: Specialization) -> np.ndarray:
    program = compiler.load(spec)
    request = program.compiled.create_infer_request()
    for port in program.compiled.inputs:
        tensor = request.get_tensor(port)
        values = np.zeros(tensor.shape, dtype=tensor.element_type.to_dtype())
        if "input_ids" in port.any_name:
            values[...] = 7
        if "attention_mask" in port.any_name:
            values[..., -1] = 1
        tensor.data[...] = values
    request.infer()
    return np.array(request.get_tensor(program.compiled.outputs[0]).data)


def test_the_profile_folds_for_weightless_blobs_and_names_a_bank_per_weights_file() -> None:
    npuw = profile_for("NPU", NPUW)
    weightless = npuw.blob_properties(BlobMode.WEIGHTLESS, NPUW)
    assert weightless[FOLD] == "YES" and weightless["ENABLE_WEIGHTLESS"] == "YES"
    assert FOLD not in npuw.blob_properties(BlobMode.WEIGHTLESS, {**NPUW, FOLD: "NO"})
    # NPUW exports a folded model weightless unless told not to.
    assert npuw.blob_properties(BlobMode.FULL, NPUW) == {"ENABLE_WEIGHTLESS": "NO"}
    assert npuw.exact_properties[FOLD] == "NO"
    a, b = (npuw.shared_weights_properties(d * 32)[WEIGHTS_BANK] for d in "ab")
    assert a != b
    assert profile_for("CPU").shared_weights_properties("a" * 32) == {}


def test_a_weightless_npuw_blob_imports_and_computes_what_a_full_one_does(
    tiny_dir: Path, tmp_path: Path
) -> None:
    spec = Specialization.decode(64)
    model = ModelDir.open(tiny_dir)
    runs = {}
    for mode in BlobMode:
        store = Store(tmp_path / mode.value)
        compiler = Compiler(model, "NPU", NPUW, store, blob_mode=mode)
        try:
            logits = _logits(compiler, spec)
            # The graph's blob and the shared LM head's: what the store holds for the rung
            # (the embedding is the host's lookup in the .bin: no blob).
            runs[mode] = (sum(e.size_bytes for e in store.entries()), logits)
            graph = compiler.specialize(spec)
        finally:
            compiler.close()
    (full_bytes, full), (weightless_bytes, weightless) = (
        runs[BlobMode.FULL],
        runs[BlobMode.WEIGHTLESS],
    )
    graph_weight_bytes = sum(
        op.get_byte_size() for op in graph.get_ordered_ops() if op.get_type_name() == "Constant"
    )
    # The full blobs carry at least the graph's weights (and the head's); the weightless
    # ones leave them in the .bin.
    assert full_bytes - weightless_bytes > graph_weight_bytes
    assert np.abs(full).max() > 0.1  # not an all-zero graph
    assert float(np.abs(full - weightless).max()) < 1e-4


def test_a_ladders_weightless_blobs_store_the_weights_once_not_per_blob(
    small_dir: Path, tmp_path: Path
) -> None:
    model = ModelDir.open(small_dir)
    compiler = Compiler(model, "NPU", NPUW, Store(tmp_path / "store"))
    try:
        stored = [compiler.build(Specialization.decode(c)).blob_bytes for c in LADDER]
    finally:
        compiler.close()
    # Four blobs of the graph alone: together a fraction of the one .bin they point into.
    assert sum(stored) < 0.25 * model.bin_path.stat().st_size


def test_a_models_blobs_all_name_its_weights_bank(tiny_dir: Path, tmp_path: Path) -> None:
    compiler = Compiler(ModelDir.open(tiny_dir), "NPU", NPUW, Store(tmp_path / "store"))
    try:
        specs = [Specialization.decode(32), Specialization.decode(64)]
        blobs = [compiler.build(spec).path.read_bytes() for spec in specs]
        digest = compiler.key(specs[0]).value("weights")
    finally:
        compiler.close()
    bank = compiler.profile.shared_weights_properties(digest)[WEIGHTS_BANK].encode()
    # NPUW writes the bank's name into the blob; an import joins the bank it names.
    assert all(bank in blob for blob in blobs)


# A fresh process imports rung 64 and then rung 128 (each run once) and prints its RSS
# after each: the second rung's cost, with the first rung's bank or with a bank of its own,
# with the given rewrites ("default": the profile's), through a compiler per rung or one.
_SECOND_RUNG = """
import json, sys
from pathlib import Path
from ovspec.compile.compiler import Compiler
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.store.local import Store

def rss_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

model, store = ModelDir.open(sys.argv[1]), Store(Path(sys.argv[2]))
first, second, rewrites, one_compiler = sys.argv[3:]
rewrites = None if rewrites == "default" else RewriteSet.parse(rewrites)
rss, compilers = [], {}
for capacity, properties in ((64, first), (128, second)):
    # A compiler per rung, or one for both (its rungs share its head and embedding models).
    key = properties if one_compiler == "1" else capacity
    if key not in compilers:
        compilers[key] = Compiler(model, "NPU", json.loads(properties), store, rewrites=rewrites)
    program = compilers[key].load(Specialization.decode(capacity))
    program.compiled.create_infer_request().infer()
    rss.append(rss_bytes())
    globals().setdefault("kept", []).append(program)
print(json.dumps(rss))
"""


def _second_rung_bytes(
    model: Path, store: Path, second: dict[str, str], rewrites: str = "default", one: bool = False
) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = [sys.executable, "-c", _SECOND_RUNG, str(model), str(store), json.dumps(NPUW)]
    out = subprocess.run(
        [*args, json.dumps(second), rewrites, "1" if one else "0"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    first_rss, second_rss = json.loads(out.strip().splitlines()[-1])
    return int(second_rss - first_rss)


def test_a_second_rung_reuses_the_first_rungs_weights_from_the_bank(
    small_dir: Path, tmp_path: Path
) -> None:
    """The bank holds the weights once per process: a rung naming it (the profile's bank)
    costs at least half its graph's weights less than one naming a bank of its own. The
    graph's weights, not the .bin's: the profile's shared head and embedding are models of
    their own, outside every rung's graph (docs/npu.md)."""
    model = ModelDir.open(small_dir)
    own_bank = {**NPUW, WEIGHTS_BANK: "ovspec-test-own-bank"}
    for properties, capacities in ((NPUW, (64, 128)), (own_bank, (128,))):
        compiler = Compiler(model, "NPU", properties, Store(tmp_path / "store"))
        try:  # built here, imported in fresh processes: no bank of this one is involved
            for capacity in capacities:
                compiler.build(Specialization.decode(capacity))
            graph = compiler.specialize(Specialization.decode(128))
        finally:
            compiler.close()
    graph_weight_bytes = sum(
        op.get_byte_size() for op in graph.get_ordered_ops() if op.get_type_name() == "Constant"
    )
    assert graph_weight_bytes > 0.4 * model.bin_path.stat().st_size  # weights dominate it
    shared = _second_rung_bytes(small_dir, tmp_path / "store", NPUW)
    own = _second_rung_bytes(small_dir, tmp_path / "store", own_bank)
    assert own - shared > 0.5 * graph_weight_bytes, (own, shared, graph_weight_bytes)


@pytest.mark.parametrize("release", [None, False])
def test_a_decode_through_the_ladder_holds_its_rung_and_the_next_only(
    tiny_dir: Path, tmp_path: Path, release: bool | None
) -> None:
    """What keeps a decode's peak at one rung's here (docs/npu.md): the one-ahead loader
    (its default, None) drops a rung the sequence has left while the next one loads, so
    at most two decode rungs are ever held; kept (False), the ladder piles up."""
    ladder = (32, 64, 128)
    properties = {k: v for k, v in NPUW.items() if k != "NPUW_F16IC"}
    tuning = Tuning(release_passed_rungs=release)
    held: list[int] = []
    with open_rungs(
        tiny_dir, "32,64,128", device="NPU", properties=properties, store=tmp_path, tuning=tuning
    ) as loader:

        def count(_: int) -> None:
            held.append(sum(loader.program(Specialization.decode(c)) is not None for c in ladder))

        result = decode(loader, list(range(1, 9)), max_new_tokens=120, on_token=count)
    assert result.rungs == ladder
    assert max(held) == (2 if release is None else len(ladder)), held


def test_a_further_rung_holds_no_f32_copy_of_the_embedding_table(
    small_dir: Path, tmp_path: Path
) -> None:
    """With the NPU profile's default rewrites (the embedding a model of its own) a second
    rung costs at least half an f32 copy of the table less than with the head alone cut,
    whose rungs' CPU subgraphs each convert the f16 table whole (docs/npu.md: 8 MiB of
    builtin:small; measured ~12 MiB less per rung)."""
    model = ModelDir.open(small_dir)
    head_only = RewriteSet(
        profile_for("NPU", NPUW).default_rewrites.rewrites - {GraphRewrite.SHARED_EMBEDDING}
    )
    assert head_only != profile_for("NPU", NPUW).default_rewrites
    costs = {}
    for name, rewrites in (("default", None), ("head", head_only)):
        compiler = Compiler(model, "NPU", NPUW, Store(tmp_path / name), rewrites=rewrites)
        try:
            for capacity in (64, 128):
                compiler.build(Specialization.decode(capacity))
        finally:
            compiler.close()
        text = "default" if rewrites is None else rewrites.canonical
        costs[name] = _second_rung_bytes(small_dir, tmp_path / name, NPUW, text, one=True)
    config = json.loads((small_dir / "config.json").read_text(encoding="utf-8"))
    table_f32_bytes = config["vocab_size"] * config["hidden_size"] * 4
    assert costs["head"] - costs["default"] > 0.5 * table_f32_bytes, (costs, table_f32_bytes)


def test_a_blob_carrying_its_weights_imports_beside_a_live_bank_of_the_same_weights(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """A weightless rung fills the model's bank in this process; an exact rung (unfolded:
    its blob carries its weights, as a serialized bank) then imports beside it. Naming the
    same bank, the import would add its tensors under ids the live bank already holds
    (NPUW: "Assertion false failed"); such blobs name no shared bank."""
    model = ModelDir.open(tiny_dir)
    exact = {**NPUW, **profile_for("NPU", NPUW).exact_properties}
    kept = []
    for properties in (NPUW, exact, exact):
        compiler = Compiler(model, "NPU", properties, Store(tmp_path / "store"))
        try:
            kept.append(compiler.load(Specialization.decode(64)))
        finally:
            compiler.close()
    carrying = profile_for("NPU", exact).compile_properties(BlobMode.WEIGHTLESS, exact, "a" * 32)
    assert WEIGHTS_BANK not in carrying
    full = profile_for("NPU", NPUW).compile_properties(BlobMode.FULL, NPUW, "a" * 32)
    assert WEIGHTS_BANK not in full
    chosen = {**NPUW, WEIGHTS_BANK: "mine"}  # the user's choice stands
    assert (
        profile_for("NPU", chosen).compile_properties(BlobMode.FULL, chosen, "a")[WEIGHTS_BANK]
        == "mine"
    )
