"""decode() with the remap layout: the same logits as copy-and-grow at every step across
rung boundaries, on both fixtures and the built-in model; physical KV that follows the
tokens; a ladder remap cannot map refused before anything compiles."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import ovspec
from ovspec.errors import LadderError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime import vmem
from ovspec.runtime.decoding import DecodeResult, decode
from ovspec.runtime.kv import KVLayout, KVLayoutWarning
from ovspec.runtime.loader import EventKind
from ovspec.store.local import Store

DATA = Path(__file__).parents[1] / "data"
LADDER = "64,128,192,256"  # 64-byte head tokens: 64 per page, so every rung is aligned
needs_mapping = pytest.mark.skipif(
    vmem.unsupported_reason() is not None, reason=f"no page mapping: {vmem.unsupported_reason()}"
)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)  # f32 rounds a self-cosine below 1
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def run(loader: ovspec.runtime.loader.Loader, layout: KVLayout, prompt: list[int],
        forced: list[int], prefault: int | None = None) -> DecodeResult:  # fmt: skip
    return decode(
        loader,
        prompt,
        forced_ids=forced,
        kv_layout=layout,
        keep_logits=lambda _step, _live: True,
        release_passed_rungs=False,
        prefault_lead_tokens=prefault,
        measure_physical=True,
    )


@needs_mapping
@pytest.mark.parametrize("model", ["qwen2", "llama", "tiny"])
def test_remap_logits_equal_copy_and_grow_at_every_boundary(
    model: str, request: pytest.FixtureRequest, store: Store
) -> None:
    folder: Path = request.getfixturevalue("tiny_dir") if model == "tiny" else DATA / model
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 1000, 20).tolist()
    forced = rng.integers(3, 1000, 220).tolist()  # to live 240: boundaries 64, 128, 192
    with ovspec.open(
        folder, ladder=LADDER, properties=EXACT_CPU_PROPERTIES, store=store, policy="eager",
        prefill_chunk_tokens=16, load_mode="compile",
    ) as loader:  # fmt: skip
        control = run(loader, KVLayout.COPY_AND_GROW, prompt, forced)
        remap = run(loader, KVLayout.REMAP, prompt, forced)
        prefaulted = run(loader, KVLayout.COPY_AND_GROW, prompt, forced, prefault=8)
    assert remap.kv_layout == "remap" and control.kv_layout == "copy-and-grow"
    for result in (remap, prefaulted):
        assert [b.at_live_tokens for b in result.boundaries] == [64, 128, 192]
        assert sorted(result.logits) == sorted(control.logits) == list(range(len(forced) + 1))
        for step, logits in control.logits.items():
            assert int(np.argmax(result.logits[step])) == int(np.argmax(logits))
            assert cosine(result.logits[step], logits) >= 0.9999999
    # Zero copy at every boundary; copy-and-grow copies the live prefix.
    kv_bytes = control.boundaries[0].migration.copied_bytes // 64
    assert [b.migration.copied_bytes for b in remap.boundaries] == [0, 0, 0]
    assert [b.migration.copied_bytes for b in control.boundaries] == [
        64 * kv_bytes,
        128 * kv_bytes,
        192 * kv_bytes,
    ]
    # Physical KV: the written tokens in whole pages (8 blocks x 64 tokens per page),
    # though the attention read every rung's whole capacity at every step.
    blocks = kv_bytes // 64
    for sample in remap.kv_samples:
        assert sample.physical_bytes == blocks * -(-sample.live_tokens // 64) * vmem.PAGE_BYTES
    assert max(b.migration.peak_physical_bytes or 0 for b in remap.boundaries) <= max(
        s.physical_bytes or 0 for s in remap.kv_samples
    )
    for b in control.boundaries:  # the transient double remap avoids
        assert b.migration.peak_physical_bytes == 2 * b.migration.copied_bytes


@needs_mapping
def test_the_default_layout_is_remap_on_an_aligned_ladder(qwen2_dir: Path, store: Store) -> None:
    with ovspec.open(
        qwen2_dir,
        ladder="64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        load_mode="compile",
    ) as loader:
        aligned = decode(loader, [5, 6, 7], max_new_tokens=70)
    assert (aligned.kv_layout, aligned.kv_note) == ("remap", "")
    with ovspec.open(
        qwen2_dir, ladder="32,64", properties=EXACT_CPU_PROPERTIES, store=store, load_mode="compile"
    ) as loader:
        unaligned = decode(loader, [5, 6, 7], max_new_tokens=40)
    assert unaligned.kv_layout == "copy-and-grow"
    assert "rung 32 not page-aligned" in unaligned.kv_note


def test_open_refuses_a_remap_ladder_before_compiling(qwen2_dir: Path, store: Store) -> None:
    with pytest.raises(LadderError, match=r"cannot map rung 32: .*\(nearest: 32 -> 64\)"):
        ovspec.open(qwen2_dir, ladder="32,64", store=store, kv_layout="remap")
    assert store.stats().entries == 0  # nothing was compiled


def test_decode_refuses_a_remap_ladder_before_compiling(qwen2_dir: Path, store: Store) -> None:
    with ovspec.open(qwen2_dir, ladder="32,64", store=store, load_mode="compile") as loader:
        with pytest.raises(LadderError, match="cannot map rung 32"):
            decode(loader, [5, 6, 7], max_new_tokens=4, kv_layout=KVLayout.REMAP)
        assert not [e for e in loader.events if e.kind is EventKind.LOAD_START]


def test_remap_fails_over_with_a_warning_where_it_cannot_run(
    qwen2_dir: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vmem, "unsupported_reason", lambda: "it needs Linux; this is darwin")
    with (
        ovspec.open(
            qwen2_dir,
            ladder="32,64",
            properties=EXACT_CPU_PROPERTIES,
            store=store,
            kv_layout="remap",
        ) as loader,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        result = decode(loader, [5, 6, 7], max_new_tokens=40)
    assert result.kv_layout == "copy-and-grow"
    assert result.kv_note == (
        "the remap KV layout cannot run here (it needs Linux; this is darwin); using copy-and-grow"
    )
    assert [w.category for w in caught] == [KVLayoutWarning]
    assert len(result.boundaries) == 1
