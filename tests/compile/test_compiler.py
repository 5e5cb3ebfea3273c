"""Compiling through the store: keys, hits, weightless blobs, imports that compute right."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from conftest import load_llm

from ovspec.compile.blobfile import FileSink
from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import profile_for
from ovspec.compile.modes import BlobMode, LoadMode
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.kv import CopyAndGrowKV
from ovspec.runtime.session import DecodeSession
from ovspec.store.digests import DigestMemo
from ovspec.store.keys import explain
from ovspec.store.local import Store


class CompilerPrograms:
    def __init__(self, compiler: Compiler) -> None:
        self.compiler = compiler
        self.programs: dict[Specialization, object] = {}

    def get(self, spec: Specialization) -> ov.CompiledModel:
        program = self.compiler.load(spec)
        self.programs[spec] = program  # keeps the blob mapping alive
        return program.compiled

    def release(self, spec: Specialization) -> None:
        pass  # tests keep every graph


# The blob path's tests feed mask and positions: CPU's default rewrites minus the
# live-tokens state (that graph builds its own; tests/ir/test_rewrites.py covers it).
STORE_REWRITES = RewriteSet.parse("split-attention+last-position-logits")


def make(model_dir: Path, store: Store, **kwargs: object) -> Compiler:
    kwargs.setdefault("rewrites", STORE_REWRITES)
    return Compiler(ModelDir.open(model_dir), "CPU", EXACT_CPU_PROPERTIES, store, **kwargs)  # type: ignore[arg-type]


def test_second_build_is_a_hit_and_keys_name_their_components(
    qwen2_dir: Path, store: Store
) -> None:
    compiler = make(qwen2_dir, store)
    spec = Specialization.decode(32)
    first = compiler.build(spec)
    again = compiler.build(spec)
    assert (first.hit, again.hit) == (False, True)
    assert again.key_hex == first.key_hex and again.compile_s == first.compile_s
    other = compiler.key(Specialization.decode(64))
    diffs = explain(compiler.key(spec).values(), other.values())
    assert [d.name for d in diffs] == ["specialization"]
    compiler.close()


def test_weightless_blob_is_small_and_computes_the_same(qwen2_dir: Path, store: Store) -> None:
    spec = Specialization.decode(32)
    full = make(qwen2_dir, store, blob_mode=BlobMode.FULL)
    light = make(qwen2_dir, store, blob_mode=BlobMode.WEIGHTLESS)
    assert full.key(spec).hex != light.key(spec).hex
    bin_bytes = qwen2_dir.joinpath("openvino_model.bin").stat().st_size
    assert full.build(spec).blob_bytes > bin_bytes
    assert light.build(spec).blob_bytes < bin_bytes // 4
    feed = {
        "input_ids": np.array([[7]]),
        "position_ids": np.array([[3]]),
        "attention_mask": np.array([[1, 1, 1] + [0] * 29 + [1]]),
    }
    rng = np.random.default_rng(0)
    for role in load_llm(qwen2_dir).roles.kv:
        feed[role.past_input] = rng.standard_normal(role.shape(1, 32)).astype(np.float32)
    outs = []
    for compiler in (full, light):
        program = compiler.load(spec)
        outs.append(program.compiled.create_infer_request().infer(feed)["logits"].copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    full.close()
    light.close()


def test_file_sink_writes_what_export_returns(qwen2_dir: Path, tmp_path: Path) -> None:
    model = load_llm(qwen2_dir).specialize(Specialization.decode(32))
    compiled = ov.Core().compile_model(model, "CPU")
    with (tmp_path / "blob").open("wb") as f:
        compiled.export_model(FileSink(f))
    buffer = io.BytesIO()
    compiled.export_model(buffer)
    assert (tmp_path / "blob").read_bytes() == buffer.getvalue()


def test_imported_blobs_decode_like_the_stateful_model(tiny_dir: Path, store: Store) -> None:
    """The built-in model through store-imported weightless blobs, across two boundaries."""
    compiler = make(tiny_dir, store)
    llm = compiler.llm()
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 2048, 20).tolist()
    forced = rng.integers(3, 2048, 60).tolist()
    control = StatefulRunner(
        ov.Core().read_model(tiny_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    )
    expected = control.teacher_forced(prompt, forced)
    session = DecodeSession(
        llm.roles,
        Ladder((32, 64, 128)),
        CopyAndGrowKV(llm.roles, 32),
        CompilerPrograms(compiler),
        16,
    )
    got = np.stack([session.prefill(prompt)] + [session.step(t) for t in forced])
    assert len(session.boundaries) == 2
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    cos = (
        (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    )
    assert cos.min() >= 0.99999
    session.close()
    compiler.close()


@pytest.mark.parametrize("text", ["int8", "int4:16"])
def test_compression_is_in_the_key_and_still_decodes(
    qwen2_dir: Path, store: Store, text: str
) -> None:
    plain = make(qwen2_dir, store)
    packed = make(qwen2_dir, store, compression=Compression.parse(text))
    spec = Specialization.decode(32)
    diffs = [d.name for d in explain(plain.key(spec).values(), packed.key(spec).values())]
    assert diffs == ["compression"]
    program = packed.load(spec)
    request = program.compiled.create_infer_request()
    feed = {"input_ids": np.array([[7]]), "position_ids": np.array([[0]])}
    feed["attention_mask"] = np.array([[0] * 32 + [1]])
    for role in packed.llm().roles.kv:
        feed[role.past_input] = np.zeros(role.shape(1, 32), np.float32)
    assert np.isfinite(request.infer(feed)["logits"]).all()
    plain.close()
    packed.close()


def test_weights_digest_is_memoized_across_compilers(qwen2_dir: Path, store: Store) -> None:
    memo = DigestMemo(store.root / "digests")
    for _ in range(3):
        make(qwen2_dir, store, memo=memo).key(Specialization.decode(32))
    assert memo.hashed_files == 2  # the .xml and the .bin, once each
    fresh = DigestMemo(store.root / "digests")  # a later process: the disk memo answers
    make(qwen2_dir, store, memo=fresh).key(Specialization.decode(32))
    assert fresh.hashed_files == 0
    memo.close()
    fresh.close()


def test_only_the_latest_prompts_rung_decodes_on_its_prefill_graph(
    qwen2_dir: Path, store: Store
) -> None:
    cpu = profile_for("CPU").default_rewrites
    compiler = make(qwen2_dir, store, rewrites=cpu, load_mode=LoadMode.COMPILE, rung_chunk_tokens=8)
    try:
        assert compiler.graph_spec(Specialization.decode(64)) == Specialization.decode(64)
        compiler.share_rung(64)
        assert compiler.graph_spec(Specialization.decode(64)) == Specialization.prefill(64, 8)
        compiler.share_rung(32)  # a later prompt on another rung: 64 goes back to static
        assert compiler.graph_spec(Specialization.decode(64)) == Specialization.decode(64)
        assert compiler.graph_spec(Specialization.decode(32)) == Specialization.prefill(32, 8)
    finally:
        compiler.close()
