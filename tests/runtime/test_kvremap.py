"""RemapKV: no byte copied, data kept across growths, free reads, page-granular commit;
the alignment a ladder needs and the one-line refusal; the layout choice."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_fakes import Writer, make_roles

from ovspec.errors import LadderError, MappingError, RemapUnsupportedError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kv import CopyAndGrowKV, KVLayout, choose_layout, make_kv
from ovspec.runtime.kvremap import (
    RemapKV,
    aligned_ladder,
    check_ladder,
    nearest_aligned,
    quantum_tokens,
)

PAGE = vmem.PAGE_BYTES
TOKEN_BYTES = 64 * 4  # make_roles(): head_dim 64, f32
needs_mapping = pytest.mark.skipif(
    vmem.unsupported_reason() is not None, reason=f"no page mapping: {vmem.unsupported_reason()}"
)


def pages(tokens: int, token_bytes: int = TOKEN_BYTES) -> int:
    return -(-tokens * token_bytes // PAGE)


@pytest.fixture
def roles() -> ModelRoles:
    return make_roles()  # 2 layers x K, V x 2 heads: 8 blocks of 256-byte tokens


@pytest.fixture
def kv(roles: ModelRoles) -> Iterator[RemapKV]:
    cache = RemapKV(roles, 256, 4096)
    cache.measure_physical = True  # boundary peaks in every Migration
    yield cache
    cache.close()


# --------------------------------------------------------------------------- growth


@needs_mapping
def test_growth_copies_nothing_and_keeps_every_page(roles: ModelRoles, kv: RemapKV) -> None:
    writer = Writer(roles, 4096)
    for capacity in (512, 1024, 2048, 4096):
        writer.write(kv, kv.capacity_tokens - kv.live_tokens - 3)  # a partial last page
        before = kv.physical_bytes()
        assert before == kv.committed_bytes == 8 * pages(kv.live_tokens) * PAGE
        migration = kv.grow(capacity)
        assert migration.copied_bytes == 0
        # Each tensor's block 1 moves (block 0 stays in place): half the committed pages.
        assert migration.moved_bytes == before // 2
        assert migration.peak_physical_bytes == before  # never two copies at once
        assert kv.physical_bytes() == before
        assert writer.matches(kv)  # the data at the new offsets, zeros after it


@needs_mapping
def test_reading_the_whole_capacity_commits_nothing(roles: ModelRoles, kv: RemapKV) -> None:
    writer = Writer(roles, 4096)
    writer.write(kv, 5)
    kv.grow(4096)
    committed = kv.physical_bytes()
    assert committed == 8 * PAGE  # 8 blocks x 1 page
    for array in kv.arrays().values():  # numpy reads every slot, written or not
        assert float(np.abs(array[:, :, 5:]).sum()) == 0.0
    assert kv.physical_bytes() == committed
    assert vmem.smaps_rss_bytes(kv.spans()) == committed


@needs_mapping
def test_openvino_reads_the_bound_tensors_in_place_without_committing(
    roles: ModelRoles, kv: RemapKV
) -> None:
    writer = Writer(roles, 2048)
    writer.write(kv, 100)
    kv.grow(2048)
    params = [ops.parameter(r.shape(1, 2048), np.float32, name=r.past_input) for r in roles.kv]
    axes = ops.constant(np.array([0, 1, 2, 3]), ov.Type.i64)
    compiled = ov.Core().compile_model(
        ov.Model([ops.reduce_sum(p, axes) for p in params], params), "CPU"
    )
    request = compiled.create_infer_request()
    for name, tensor in kv.tensors().items():
        request.set_tensor(name, tensor)
        assert request.get_tensor(name).data.ctypes.data == kv.arrays()[name].ctypes.data
    before = kv.physical_bytes()
    request.infer()
    for i, r in enumerate(roles.kv):
        expected = writer.reference[r.past_input].sum(dtype=np.float64)
        assert float(request.get_output_tensor(i).data) == pytest.approx(expected, abs=1e-3)
    assert kv.physical_bytes() == before


@needs_mapping
def test_committed_bytes_follow_the_tokens_page_by_page(roles: ModelRoles, kv: RemapKV) -> None:
    writer = Writer(roles, 1024)
    for _ in range(600):
        if kv.live_tokens == kv.capacity_tokens:
            kv.grow(kv.capacity_tokens * 2)
        writer.write(kv, 1)
        assert kv.committed_bytes == 8 * pages(kv.live_tokens) * PAGE
        if kv.live_tokens % 7 == 0 or kv.live_tokens in (1, 16, 17, 256, 257):
            assert kv.physical_bytes() == kv.committed_bytes
    assert writer.matches(kv)


@needs_mapping
@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
    st.booleans(),
)
def test_any_write_pattern_survives_growth(chunks: list[int], ahead: bool) -> None:
    roles = make_roles(layers=1, heads=3, head_dim=16)  # 64-byte tokens: 64 per page
    ladder = Ladder((64, 128, 256, 512, 1024, 2048))
    # With the ladder, growths to the next rung use the plan built ahead; a chunk that
    # skips a rung makes grow() build its own.
    cache = RemapKV(roles, 64, ladder.top_tokens, ladder if ahead else None)
    writer = Writer(roles, ladder.top_tokens, seed=len(chunks))
    try:
        for chunk in chunks:
            if cache.live_tokens + chunk > ladder.top_tokens:
                break
            if cache.live_tokens + chunk > cache.capacity_tokens:
                cache.grow(ladder.rung_for(cache.live_tokens + chunk))
            writer.write(cache, chunk)
            assert writer.matches(cache)
            assert cache.physical_bytes() == cache.committed_bytes
    finally:
        cache.close()


@needs_mapping
def test_a_growth_built_ahead_is_the_one_the_boundary_uses(
    roles: ModelRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    ladder = Ladder((256, 512, 1024))
    cache = RemapKV(roles, 256, 1024, ladder)
    writer = Writer(roles, 1024)
    try:
        assert cache.prepared_seconds is None  # nothing written yet
        writer.write(cache, 5)
        assert cache.prepared_seconds is not None  # the first write built 256 -> 512
        writer.write(cache, cache.capacity_tokens - cache.live_tokens - 3)
        committed = cache.physical_bytes()

        def not_again(*args: object) -> None:
            raise AssertionError("grow() rebuilt a growth that was built ahead")

        monkeypatch.setattr(cache, "_moves", not_again)
        migration = cache.grow(512)
        assert migration.copied_bytes == 0 and migration.moved_bytes == committed // 2
        assert cache.physical_bytes() == committed and writer.matches(cache)
        assert cache.prepared_seconds is None  # used up; the next write builds 512 -> 1024
        names = {r.past_input for r in roles.kv}
        assert {n for n, t in cache.tensors().items() if list(t.shape)[2] == 512} == names
        monkeypatch.undo()
        writer.write(cache, 1)
        assert cache.prepared_seconds is not None
        writer.fill_to_capacity(cache)
        cache.grow(1024)
        writer.write(cache, 1)
        assert cache.prepared_seconds is None and writer.matches(cache)  # the top: no successor
    finally:
        cache.close()


@needs_mapping
def test_a_single_block_tensor_needs_no_alignment() -> None:
    roles = make_roles(heads=2, head_dim=16, seq_axis=1)  # [1, C, H, D]: one block
    assert quantum_tokens(roles) == 1
    cache = RemapKV(roles, 40, 1000)  # 40 x 128 bytes: not whole pages, and that is fine
    writer = Writer(roles, 1000)
    try:
        for capacity in (100, 300, 1000):
            writer.fill_to_capacity(cache)
            assert cache.grow(capacity).copied_bytes == 0
            assert writer.matches(cache)
    finally:
        cache.close()


@needs_mapping
def test_tensors_are_dense_and_grow_in_place(roles: ModelRoles, kv: RemapKV) -> None:
    before = [addr for addr, _ in kv.spans()]
    kv.grow(512)
    assert [addr for addr, _ in kv.spans()] == before  # the same mappings, grown
    for r, (addr, size) in zip(roles.kv, kv.spans(), strict=True):
        tensor, array = kv.tensors()[r.past_input], kv.arrays()[r.past_input]
        assert list(tensor.shape) == r.shape(1, 512)
        assert array.flags.c_contiguous and array.flags.writeable
        assert tensor.data.ctypes.data == array.ctypes.data == addr
        assert size == array.nbytes


@needs_mapping
def test_a_previous_rungs_arrays_stay_mapped_until_close(roles: ModelRoles) -> None:
    cache = RemapKV(roles, 256, 512)
    writer = Writer(roles, 512)
    writer.fill_to_capacity(cache)
    stale = cache.arrays()["past.0"]
    cache.grow(512)
    # Memory-safe, not meaningful: head 0 is where it was, head 1's old slots now hold
    # head 0's empty new capacity (zeros); a stale reader never sees another mapping.
    assert np.array_equal(stale[0, 0], writer.reference["past.0"][0, 0, :256])
    assert float(np.abs(stale[0, 1]).sum()) == 0.0
    addr = cache.spans()[0][0]
    cache.close()
    assert mapped(addr)  # `stale` still holds its mapping
    del stale
    gc.collect()
    assert not mapped(addr)


@needs_mapping
@pytest.mark.parametrize("heads", [2, 3])
def test_a_fine_ladder_moves_overlapping_blocks_through_scratch(heads: int) -> None:
    roles = make_roles(heads=heads)  # 256-byte tokens: rungs in steps of 16 tokens
    ladder = Ladder((256, 272, 320, 512, 528))  # 256 -> 272: block 1 lands on itself
    cache = RemapKV(roles, 256, ladder.top_tokens)
    cache.measure_physical = True
    writer = Writer(roles, ladder.top_tokens)
    try:
        for capacity in list(ladder)[1:]:
            writer.fill_to_capacity(cache)
            committed = cache.physical_bytes()
            assert committed is not None
            migration = cache.grow(capacity)
            assert migration.copied_bytes == 0
            assert migration.moved_bytes == (heads - 1) * committed // heads
            assert cache.physical_bytes() == committed
            assert writer.matches(cache)
    finally:
        cache.close()


def mapped(addr: int) -> bool:
    with open("/proc/self/maps") as f:
        spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in f]
    return any(low <= addr < high for low, high in spans)


@needs_mapping
def test_a_refused_move_leaves_the_cache_as_it_was(
    roles: ModelRoles, kv: RemapKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(roles, 1024)
    writer.fill_to_capacity(kv)
    libc = vmem._libc()
    real = libc.move
    calls = []

    def flaky(src: int, size: int, dst: int, keep_source: bool) -> None:
        calls.append(src)
        if len(calls) == 3:  # after 2 of the 4 moves (block 1 of each tensor)
            raise MappingError("mremap failed: injected")
        real(src, size, dst, keep_source)

    monkeypatch.setattr(libc, "move", flaky)
    resident = kv.physical_bytes()
    with pytest.raises(MappingError, match="injected"):
        kv.grow(512)
    monkeypatch.setattr(libc, "move", real)
    assert kv.capacity_tokens == 256 and writer.matches(kv)
    assert kv.physical_bytes() == resident
    kv.grow(512)
    assert writer.matches(kv)


@needs_mapping
def test_growing_an_empty_cache_moves_nothing(roles: ModelRoles, kv: RemapKV) -> None:
    migration = kv.grow(1024)  # a long prompt grows the cache before anything is live
    assert migration.moved_bytes == 0 and kv.physical_bytes() == 0
    kv.measure_physical = False  # the default: no pagemap read inside grow()
    assert kv.grow(2048).peak_physical_bytes is None
    Writer(roles, 1024).write(kv, 1)
    assert kv.physical_bytes() == 8 * PAGE


# --------------------------------------------------------------------------- alignment


def test_the_quantum_and_the_nearest_aligned_capacities() -> None:
    roles = make_roles()  # 256-byte head tokens
    assert quantum_tokens(roles, 4096) == 16
    assert quantum_tokens(roles, 16384) == 64
    assert quantum_tokens(make_roles(head_dim=16), 4096) == 64  # the fixtures' shape
    assert nearest_aligned(1000, 16) == (992, 1008)
    assert nearest_aligned(1024, 16) == (1024, 1024)
    assert nearest_aligned(40, 64) == (0, 64)
    assert aligned_ladder(Ladder((32, 100, 1000)), 64) == Ladder((64, 128, 1024))
    assert aligned_ladder(Ladder((60, 64)), 64) == Ladder((64, 128))  # kept increasing


def test_a_ladder_remap_cannot_map_is_refused_in_one_line() -> None:
    roles = make_roles(head_dim=16)  # 64-byte tokens: 64 per 4 KiB page
    check_ladder(roles, Ladder((64, 128, 4096)), 4096)
    with pytest.raises(LadderError) as caught:
        check_ladder(roles, Ladder((32, 64, 100)), 4096)
    message = str(caught.value)
    assert "\n" not in message
    assert "rungs 32, 100" in message
    assert "multiples of 64 tokens" in message
    assert "32 -> 64; 100 -> 64 or 128" in message
    assert "--ladder 64,128,192" in message and "copy-and-grow" in message
    assert LadderError.exit_code == 2


def test_the_remap_layout_refuses_an_unaligned_capacity() -> None:
    roles = make_roles()
    with pytest.raises(LadderError, match="multiples of"):
        RemapKV(roles, 1000 if PAGE == 4096 else 1, 2048)


# --------------------------------------------------------------------------- the choice


@needs_mapping
def test_the_default_is_remap_where_the_ladder_is_aligned() -> None:
    roles = make_roles(head_dim=16)
    assert choose_layout(None, roles, Ladder((64, 128))).layout is KVLayout.REMAP
    fallback = choose_layout(None, roles, Ladder((32, 64)))
    assert fallback.layout is KVLayout.COPY_AND_GROW and not fallback.failover
    assert "rung 32 not page-aligned" in fallback.note
    with pytest.raises(LadderError, match="cannot map rung 32"):
        choose_layout(KVLayout.REMAP, roles, Ladder((32, 64)))
    kept = choose_layout(KVLayout.SHARED_MAX, roles, Ladder((32, 64)))
    assert kept.layout is KVLayout.SHARED_MAX and kept.note == ""


def test_remap_fails_over_where_pages_cannot_be_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "it needs Linux (mremap); this is darwin"
    monkeypatch.setattr(vmem, "unsupported_reason", lambda: reason)
    roles = make_roles(head_dim=16)
    asked = choose_layout(KVLayout.REMAP, roles, Ladder((32, 64)))  # not refused: failed over
    assert asked.layout is KVLayout.COPY_AND_GROW and asked.failover
    assert asked.note == f"the remap KV layout cannot run here ({reason}); using copy-and-grow"
    default = choose_layout(None, roles, Ladder((64, 128)))
    assert default.layout is KVLayout.COPY_AND_GROW and not default.failover
    with pytest.raises(RemapUnsupportedError, match="this is darwin; use copy-and-grow"):
        RemapKV(roles, 64, 128)
    # copy-and-grow falls back to numpy buffers and still grows correctly.
    cache = make_kv(KVLayout.COPY_AND_GROW, roles, 64, 128)
    assert isinstance(cache, CopyAndGrowKV)
    writer = Writer(roles, 128)
    writer.fill_to_capacity(cache)
    cache.grow(128)
    assert writer.matches(cache)
