"""The LM head cut out of the rung graphs (ir/headcut.py, compile/sharedhead.py): exactly
the uncut model's tokens and logits on the CPU plugin and the NPU path, keys of their own,
and one head compiled for a whole ladder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest

import ovspec
from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.modes import LoadMode
from ovspec.compile.sharedhead import HEAD_SPECIALIZATION
from ovspec.compile.sharedhead import HeadedCompiledModel as Headed
from ovspec.ir.headcut import HEAD_MODEL_NAME, HIDDEN_OUTPUT
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


def _with(rewrites: RewriteSet, cut: bool) -> RewriteSet:
    return RewriteSet(rewrites.rewrites | HEAD if cut else rewrites.rewrites - HEAD)


@pytest.fixture(params=["qwen2", "llama", "tiny"])
def model_dir(request: pytest.FixtureRequest, tiny_dir: Path) -> Path:
    if request.param == "tiny":
        return tiny_dir
    return Path(__file__).resolve().parents[1] / "data" / str(request.param)


@pytest.mark.parametrize("device", list(PATHS))
def test_the_cut_decodes_the_uncut_models_tokens_and_logits(
    model_dir: Path, device: str, tmp_path: Path
) -> None:
    properties, load_mode, rewrites = PATHS[device]
    reference = model_dir / "reference.npz"
    prompt = [int(t) for t in np.load(reference)["prompt_ids"]] if reference.exists() else [5] * 9
    runs = {}
    for cut in (False, True):
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
    uncut, headed = runs[False], runs[True]
    assert headed.rungs == uncut.rungs == (32, 64)  # a boundary crossed, a prompt graph run
    assert headed.token_ids == uncut.token_ids
    assert headed.logits.keys() == uncut.logits.keys() and uncut.logits
    for step, logits in uncut.logits.items():  # the same nodes on the same row: exact
        np.testing.assert_array_equal(headed.logits[step], logits)


def test_the_cut_graphs_and_the_head_have_keys_of_their_own(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    properties, _, rewrites = PATHS["NPU"]
    store = Store(tmp_path / "store")
    model = ModelDir.open(qwen2_dir)
    keys: dict[bool, Any] = {}
    for cut in (False, True):
        compiler = Compiler(model, "NPU", properties, store, rewrites=_with(rewrites, cut))
        try:
            specs = [Specialization.decode(32), Specialization.prefill(32, 16)]
            keys[cut] = [compiler.key(s).hex for s in specs] + [compiler.head_key().hex]
        finally:
            compiler.close()
    # The cut changes every graph's key; the head is an entry of its own.
    assert all(a != b for a, b in zip(keys[False][:-1], keys[True][:-1], strict=True))
    assert keys[True][-1] not in keys[False] + keys[True][:-1]


class _CountingCore:
    """A Core that counts the head models it compiles."""

    def __init__(self, core: ov.Core) -> None:
        self._core = core
        self.head_compiles = 0

    def compile_model(self, model: ov.Model, *args: Any) -> ov.CompiledModel:
        self.head_compiles += model.get_friendly_name() == HEAD_MODEL_NAME
        return self._core.compile_model(model, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


@pytest.mark.parametrize("device", list(PATHS))
def test_a_ladder_compiles_its_head_once(tiny_dir: Path, tmp_path: Path, device: str) -> None:
    properties, load_mode, rewrites = PATHS[device]
    store = Store(tmp_path / "store")
    compiler = Compiler(
        ModelDir.open(tiny_dir),
        device,
        properties,
        store,
        rewrites=_with(rewrites, True),
        load_mode=LoadMode(load_mode),
    )
    counting = _CountingCore(compiler._core)
    compiler._core = counting  # type: ignore[assignment]
    try:
        specs = [Specialization.decode(c) for c in (32, 64, 128, 256)]
        programs = [compiler.load(s) for s in [Specialization.prefill(32, 16), *specs]]
        for program in programs:
            assert isinstance(program.compiled, Headed)
            assert any(HIDDEN_OUTPUT in p.names for p in program.compiled.body.outputs)
        heads = {id(p.compiled.head) for p in programs if isinstance(p.compiled, Headed)}
    finally:
        compiler.close()
    assert counting.head_compiles == 1 and len(heads) == 1
    stored = [e.values()["specialization"] for e in store.entries()]
    assert stored.count(HEAD_SPECIALIZATION) == (1 if load_mode == "import" else 0)
