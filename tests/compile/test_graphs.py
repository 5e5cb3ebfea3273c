"""Specialized graphs kept in the store (COMPILE mode): a warm start neither prepares nor
specializes the IR, the kept files hold no copy of the weights, and anything wrong with
a kept graph falls back to the IR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

import ovspec
import ovspec.compile.compiler as compiler_module
from ovspec.compile.graphs import PLACEHOLDER_PREFIX, GraphShelf, ir_constants, weights_of
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import prepare, read_ir
from ovspec.runtime.decoding import decode
from ovspec.store.local import Store

PROMPT = [5, 17, 99, 3, 250, 41, 7, 12, 64, 33]


def generate(model_dir: Path, store: Store, tokens: int = 40) -> tuple[int, ...]:
    with ovspec.open(
        model_dir,
        ladder="32,64",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        prefill_chunk_tokens=8,
    ) as loader:
        assert loader.compiler.kept.shelf.folder == store.layout.graphs
        return decode(loader, PROMPT, max_new_tokens=tokens).token_ids


def kept(store: Store) -> list[Path]:
    return sorted(store.layout.graphs.glob("*.xml"))


def test_a_warm_start_compiles_kept_graphs_without_preparing_the_ir(
    tiny_dir: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = generate(tiny_dir, store)
    graphs = kept(store)
    assert len(graphs) == 2  # the two rungs' graphs (each serves prefill and decode)

    def refuse(*_: object) -> None:
        raise AssertionError("a warm start prepared the IR")

    monkeypatch.setattr(compiler_module, "prepare_model", refuse)
    assert generate(tiny_dir, store) == cold
    assert kept(store) == graphs


def test_a_kept_graph_holds_no_copy_of_the_weights(tiny_dir: Path, store: Store) -> None:
    generate(tiny_dir, store, tokens=4)
    model_bin = (tiny_dir / "openvino_model.bin").stat().st_size
    for xml in kept(store):
        assert xml.with_suffix(".bin").stat().st_size < model_bin / 10
        graph = ov.Core().read_model(xml)
        weights = [
            p
            for p in graph.get_parameters()
            if p.get_friendly_name().startswith(PLACEHOLDER_PREFIX)
        ]
        assert len(weights) >= 4  # embedding, per-layer projections, ...


def test_a_damaged_kept_graph_falls_back_to_the_ir(tiny_dir: Path, store: Store) -> None:
    cold = generate(tiny_dir, store)
    for xml in kept(store):
        xml.write_text("<net>not a graph", encoding="utf-8")
    assert generate(tiny_dir, store) == cold


def test_a_kept_graph_naming_a_weight_the_ir_lacks_is_not_used(
    tiny_dir: Path, tmp_path: Path
) -> None:
    ir = read_ir(tiny_dir / "openvino_model.xml")
    shelf = GraphShelf(tmp_path / "graphs")
    constants = ir_constants(ir)
    llm = prepare(read_ir(tiny_dir / "openvino_model.xml"))
    assert shelf.save("k", llm.model, llm.roles, constants) > 0
    assert shelf.load("k", lambda: constants) is not None
    assert shelf.load("k", lambda: {}) is None  # the IR has none of the named weights
    assert shelf.load("absent", lambda: constants) is None
    (tmp_path / "graphs" / "k.json").write_text('{"graph_format": 0}', encoding="utf-8")
    assert shelf.load("k", lambda: constants) is None  # another format


def test_only_constants_with_the_irs_bytes_are_weights() -> None:
    def model_with(data: np.ndarray) -> ov.Model:
        p = ov.op.Parameter(ov.Type.f32, ov.PartialShape([1, 2048]))
        c = ov.op.Constant(data)
        c.set_friendly_name("w")
        return ov.Model([ov.opset13.add(p, c)], [p])

    weights = np.arange(2048, dtype=np.float32)[None]
    ir = {"w": ov.op.Constant(weights.copy())}
    same = model_with(weights.copy())
    assert [name for _, name in weights_of(same, ir)] == ["w"]
    changed = weights.copy()
    changed[0, 1000] = -1.0  # not in the first or last 64 bytes
    assert weights_of(model_with(changed), ir) == []
    assert weights_of(model_with(weights.copy()), {}) == []
