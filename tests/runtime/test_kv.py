"""The KV layout registry, and copy-and-grow over page mappings, with and without
pre-faulting the successor."""

from __future__ import annotations

import pytest
from kv_fakes import Writer, make_roles

from ovspec.errors import LadderError, MappingError
from ovspec.ir.roles import ModelRoles
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.kv import (
    LAYOUTS,
    CopyAndGrowKV,
    KVCache,
    KVLayout,
    Prefault,
    SharedMaxKV,
    Unsupported,
    choose_layout,
    layout_class,
    make_kv,
)

PAGE = vmem.PAGE_BYTES
TOKEN_BYTES = 64 * 4
LIVE_256 = 8 * 256 * TOKEN_BYTES  # 8 blocks x 256 tokens x 256 bytes: 16 pages each
needs_mapping = pytest.mark.skipif(
    vmem.unsupported_reason() is not None, reason=f"no page mapping: {vmem.unsupported_reason()}"
)


@pytest.fixture
def roles() -> ModelRoles:
    return make_roles()


@needs_mapping
def test_copy_and_grow_copies_the_live_prefix_and_commits_what_it_writes(
    roles: ModelRoles,
) -> None:
    cache = CopyAndGrowKV(roles, 256)
    cache.measure_physical = True
    writer = Writer(roles, 1024)
    writer.fill_to_capacity(cache)
    assert cache.physical_bytes() == LIVE_256
    migration = cache.grow(512)
    assert migration.copied_bytes == LIVE_256 and migration.moved_bytes == 0
    assert migration.peak_physical_bytes == 2 * LIVE_256  # old and new both hold the prefix
    assert migration.peak_reserved_bytes == (256 + 512) * roles.kv_bytes_per_token
    assert cache.physical_bytes() == LIVE_256  # the old buffers are gone
    assert writer.matches(cache)


@needs_mapping
@pytest.mark.parametrize("use_memset", [False, True])
def test_a_prefault_commits_the_copy_target_only(roles: ModelRoles, use_memset: bool) -> None:
    ladder = Ladder((256, 512))
    cache = CopyAndGrowKV(roles, 256, Prefault(ladder, lead_tokens=8, use_memset=use_memset))
    cache.measure_physical = True
    writer = Writer(roles, 512)
    writer.write(cache, 247)
    assert cache.reserved_bytes == 256 * roles.kv_bytes_per_token and not cache.prefaults
    writer.write(cache, 1)  # 248 = 256 - 8: the pre-fault starts
    cache.wait_prefault()
    (record,) = cache.prefaults
    assert (record.capacity_tokens, record.started_at_live_tokens) == (512, 248)
    assert record.faulted_bytes == LIVE_256
    assert record.method == ("memset" if use_memset else "populate-write") or (
        not vmem.populate_write_supported() and record.method == "memset"
    )
    # Counted from the moment it is touched: reserved and physical both include it.
    assert cache.reserved_bytes == (256 + 512) * roles.kv_bytes_per_token
    assert cache.physical_bytes() == 8 * -(-248 * TOKEN_BYTES // PAGE) * PAGE + LIVE_256
    writer.fill_to_capacity(cache)
    assert len(cache.prefaults) == 1  # once per rung
    migration = cache.grow(512)
    assert migration.copied_bytes == LIVE_256
    assert migration.peak_physical_bytes == 2 * LIVE_256  # the copy faulted no new page
    assert cache.physical_bytes() == LIVE_256
    assert cache.reserved_bytes == 512 * roles.kv_bytes_per_token
    assert writer.matches(cache)


@needs_mapping
def test_prefaults_follow_the_ladder_across_boundaries(roles: ModelRoles) -> None:
    ladder = Ladder((256, 512, 1024, 2048))
    cache = CopyAndGrowKV(roles, 256, Prefault(ladder, lead_tokens=32))
    writer = Writer(roles, 2048)
    while cache.live_tokens < 1500:
        if cache.live_tokens == cache.capacity_tokens:
            cache.grow(ladder.rung_for(cache.live_tokens + 1))
        writer.write(cache, 1)
    cache.close()
    assert [(p.capacity_tokens, p.started_at_live_tokens) for p in cache.prefaults] == [
        (512, 224),
        (1024, 480),
        (2048, 992),
    ]
    assert writer.matches(cache)


@needs_mapping
def test_a_failed_prefault_is_raised_at_the_boundary(
    roles: ModelRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(spans: object, use_memset: bool = False) -> int:
        raise MappingError("madvise(23) failed: injected")

    monkeypatch.setattr(vmem, "populate_write", refuse)
    cache = CopyAndGrowKV(roles, 256, Prefault(Ladder((256, 512)), lead_tokens=4))
    Writer(roles, 512).fill_to_capacity(cache)
    with pytest.raises(MappingError, match="injected"):
        cache.grow(512)
    assert cache.capacity_tokens == 256


def test_prefault_and_copy_work_on_numpy_buffers(
    roles: ModelRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vmem, "unsupported_reason", lambda: "it needs Linux; this is darwin")
    cache = CopyAndGrowKV(roles, 256, Prefault(Ladder((256, 512)), lead_tokens=4))
    writer = Writer(roles, 512)
    writer.fill_to_capacity(cache)
    cache.wait_prefault()
    assert [p.method for p in cache.prefaults] == ["memset"]
    assert cache.grow(512).copied_bytes == LIVE_256
    assert writer.matches(cache)


def test_a_prefault_lead_must_be_positive() -> None:
    with pytest.raises(LadderError, match="lead must be >= 1"):
        Prefault(Ladder((256,)), lead_tokens=0)


@pytest.mark.parametrize("dense", [True, False])
def test_shared_max_reports_its_buffers(roles: ModelRoles, dense: bool) -> None:
    cache = SharedMaxKV(roles, 256, 1024, dense_views=dense)
    writer = Writer(roles, 1024)
    writer.fill_to_capacity(cache)
    assert sum(size for _, size in cache.spans()) == cache.reserved_bytes
    migration = cache.grow(512)
    assert migration.allocated_bytes == 0 and writer.matches(cache)
    # Dense views re-stride the live KV in place; strided views move nothing.
    assert migration.copied_bytes == (roles.kv_bytes_per_token * 256 if dense else 0)
    assert all(a.flags.c_contiguous for a in cache.arrays().values()) == dense
    writer.fill_to_capacity(cache)  # the new rung's slots after the live ones
    cache.grow(1024)
    assert writer.matches(cache)


# --------------------------------------------------------------------------- the registry


def test_every_layout_is_registered_once_and_made_by_its_class(roles: ModelRoles) -> None:
    assert sorted(cls.layout.value for cls in LAYOUTS) == sorted(k.value for k in KVLayout)
    for layout in KVLayout:
        if layout is KVLayout.REMAP and vmem.unsupported_reason() is not None:
            continue
        cache = make_kv(layout, roles, 256, 512, ladder=Ladder((256, 512)))
        try:
            assert type(cache) is layout_class(layout) and cache.layout is layout
        finally:
            cache.close()
    # Shared-max reserves the top rung from the start: never a default.
    assert [c.layout for c in LAYOUTS if c.chosen_by_default] == [
        KVLayout.REMAP,
        KVLayout.COPY_AND_GROW,
    ]


class _Refusing(CopyAndGrowKV):
    """A layout that cannot take a ladder with a rung over 256 tokens."""

    @classmethod
    def unsupported(cls, roles: ModelRoles, ladder: Ladder) -> Unsupported | None:
        return Unsupported("over 256 tokens") if ladder.top_tokens > 256 else None


class _Absent(CopyAndGrowKV):
    """A layout this machine lacks."""

    layout = KVLayout.SHARED_MAX

    @classmethod
    def unsupported(cls, roles: ModelRoles, ladder: Ladder) -> Unsupported | None:
        return Unsupported("no such hardware here", platform=True)


def test_the_choice_asks_each_layout_in_the_registrys_order(
    roles: ModelRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: tuple[type[KVCache], ...] = (_Refusing, SharedMaxKV, CopyAndGrowKV)
    monkeypatch.setattr("ovspec.runtime.kv.LAYOUTS", order)
    # The default skips what does not fit, and says why.
    fits = choose_layout(None, roles, Ladder((256,)))
    assert fits.layout is KVLayout.COPY_AND_GROW and fits.note == ""  # _Refusing is it
    skipped = choose_layout(None, roles, Ladder((256, 512)))
    assert skipped.note == "over 256 tokens; using copy-and-grow" and not skipped.failover
    # Asked for by name: a ladder it cannot take is refused, in its own words.
    with pytest.raises(LadderError, match="over 256 tokens; choose another KV layout"):
        choose_layout(KVLayout.COPY_AND_GROW, roles, Ladder((256, 512)))
    # A layout the platform lacks fails over to the default, with the note.
    monkeypatch.setattr("ovspec.runtime.kv.LAYOUTS", (_Absent, CopyAndGrowKV))
    asked = choose_layout(KVLayout.SHARED_MAX, roles, Ladder((256, 512)))
    assert asked.layout is KVLayout.COPY_AND_GROW and asked.failover
    assert asked.note == "no such hardware here; using copy-and-grow"
