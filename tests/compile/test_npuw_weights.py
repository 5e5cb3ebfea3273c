"""The NPU path's weights held once in the store: NPUW's weightless blobs (a ladder stores
the .bin once, not once per blob), each naming the model's one weights bank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.devices.npuw import FOLD, WEIGHTS_BANK
from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import ModelDir, resolve_model
from ovspec.ir.specialize import Specialization
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
        compiler = Compiler(model, "NPU", NPUW, Store(tmp_path / mode.value), blob_mode=mode)
        try:
            runs[mode] = (compiler.build(spec).blob_bytes, _logits(compiler, spec))
        finally:
            compiler.close()
    (full_bytes, full), (weightless_bytes, weightless) = (
        runs[BlobMode.FULL],
        runs[BlobMode.WEIGHTLESS],
    )
    bin_bytes = model.bin_path.stat().st_size
    assert full_bytes > bin_bytes > 2 * weightless_bytes
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
