"""Continuous batching on the paged graph: every sequence's tokens in a batch are its
batch-1 tokens, whatever joins or leaves around it; blocks come back; the pool grows
along the ladder and past it only up to the budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ovspec
from ovspec.errors import BadRequestError, LadderError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder
from ovspec.runtime.batching import BatchRequest, ContinuousBatcher, Finish, TokenEvent
from ovspec.runtime.blockpool import reservation_schedule
from ovspec.runtime.decoding import decode
from ovspec.runtime.generation import generate
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.sampling import GenerationConfig

CHUNK_TOKENS = 16


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PagedLoader]:
    data = Path(__file__).parents[1] / "data" / "qwen2"
    with ovspec.open(
        data,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=tmp_path_factory.mktemp("store"),
        load_mode="paged",
        prefill_chunk_tokens=CHUNK_TOKENS,
    ) as opened:
        assert isinstance(opened, PagedLoader)
        yield opened


def prompt(length: int, seed: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(3, 2000, length))


def tokens_by_sequence(events: list[TokenEvent]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for event in events:
        if event.token_id is not None:
            out.setdefault(event.sequence_id, []).append(event.token_id)
    return out


def test_each_sequence_in_a_batch_gets_its_batch_1_tokens(loader: PagedLoader) -> None:
    # Four sequences, three slots: different prompt lengths (one over two chunks), token
    # limits crossing the 32/64 boundaries at different steps; one joins mid-run, one
    # waits for a slot and takes the one a finished sequence gave back.
    cases = [(5, 70), (40, 50), (23, 20), (9, 100)]
    requests = [
        BatchRequest(prompt(n, seed), GenerationConfig(max_new_tokens=m))
        for seed, (n, m) in enumerate(cases)
    ]
    expected = [
        list(decode(loader, r.prompt_ids, r.config.max_new_tokens).token_ids) for r in requests
    ]
    batcher = ContinuousBatcher(loader, max_sequences=3)
    events: list[TokenEvent] = []
    ids = [batcher.submit(requests[0]), batcher.submit(requests[1])]
    for _ in range(6):
        events.extend(batcher.step())
    ids += [batcher.submit(requests[2]), batcher.submit(requests[3])]
    events.extend(batcher.step())
    assert (batcher.running, batcher.waiting) == (3, 1)  # three slots: the fourth waits
    events.extend(batcher.run())

    got = tokens_by_sequence(events)
    assert [got[i] for i in ids] == expected
    finishes = {e.sequence_id: e.finish for e in events if e.finish is not None}
    assert set(finishes.values()) == {Finish.MAX_NEW_TOKENS}
    # It was a batch: calls carried several sequences, prompt chunks beside decode steps.
    assert max(s.sequences for s in batcher.steps) == 3
    assert any(0 < s.prefill_tokens < s.new_tokens for s in batcher.steps)
    # The pool grew at boundaries past one rung, then, empty, went back to the first.
    grown = [g.migration.to_capacity_tokens for g in batcher.growths]
    assert grown == sorted(grown) and grown[-1] > 128
    assert batcher.pool.used_blocks == 0 and batcher.pool.capacity_tokens == 32
    assert batcher.pool.check() == []
    batcher.close()


def test_eos_stop_and_cancel_leave_the_others_exact(loader: PagedLoader) -> None:
    a, b, c = prompt(12, 10), prompt(30, 11), prompt(7, 12)
    reference_a = list(decode(loader, a, 40).token_ids)
    reference_c = list(decode(loader, c, 60).token_ids)
    stop_id = reference_a[9]
    batcher = ContinuousBatcher(loader, max_sequences=4)
    ia = batcher.submit(BatchRequest(a, GenerationConfig(40, stop_token_ids=frozenset({stop_id}))))
    ib = batcher.submit(BatchRequest(b, GenerationConfig(max_new_tokens=60)))
    ic = batcher.submit(BatchRequest(c, GenerationConfig(max_new_tokens=60)))
    events: list[TokenEvent] = []
    for _ in range(8):
        events.extend(batcher.step())
    batcher.cancel(ib)
    events.extend(batcher.run())
    got = tokens_by_sequence(events)
    assert got[ia] == reference_a[: reference_a.index(stop_id) + 1]
    assert got[ic] == reference_c
    finishes = {e.sequence_id: e.finish for e in events if e.finish is not None}
    assert finishes == {ia: Finish.EOS, ib: Finish.CANCELLED, ic: Finish.MAX_NEW_TOKENS}
    assert batcher.pool.used_blocks == 0 and batcher.pool.check() == []


def test_sampled_sequences_match_generate_with_the_same_seed(loader: PagedLoader) -> None:
    configs = [
        GenerationConfig(max_new_tokens=25, do_sample=True, temperature=0.8, top_p=0.9, rng_seed=s)
        for s in (1, 2)
    ]
    prompts = [prompt(6, 20), prompt(19, 21)]
    expected = [
        list(generate(loader, p, c).token_ids) for p, c in zip(prompts, configs, strict=True)
    ]
    batcher = ContinuousBatcher(loader, max_sequences=2)
    ids = [batcher.submit(BatchRequest(p, c)) for p, c in zip(prompts, configs, strict=True)]
    got = tokens_by_sequence(batcher.run())
    assert [got[i] for i in ids] == expected


def test_a_callback_stops_its_sequence(loader: PagedLoader) -> None:
    seen: list[int] = []

    def stop_at_five(token: int) -> bool:
        seen.append(token)
        return len(seen) == 5

    batcher = ContinuousBatcher(loader, max_sequences=1)
    index = batcher.submit(BatchRequest(prompt(4, 30), GenerationConfig(50)), stop_at_five)
    events = batcher.run()
    assert tokens_by_sequence(events)[index] == seen and len(seen) == 5
    assert events[-1].finish is Finish.STOPPED


def test_a_request_over_the_top_rung_is_refused_at_submit(loader: PagedLoader) -> None:
    batcher = ContinuousBatcher(loader, max_sequences=2)
    with pytest.raises(BadRequestError, match="over the top rung 128"):
        batcher.submit(BatchRequest(prompt(100, 1), GenerationConfig(max_new_tokens=40)))
    with pytest.raises(BadRequestError, match="outside the model's vocabulary"):
        batcher.submit(BatchRequest((1, 10**7), GenerationConfig(4)))
    assert batcher.idle


def test_the_budget_holds_a_request_back_until_blocks_come_back(loader: PagedLoader) -> None:
    # A budget of one top rung: two 100-position requests cannot both be promised it.
    batcher = ContinuousBatcher(loader, max_sequences=2, kv_budget_tokens=128)
    first = batcher.submit(BatchRequest(prompt(50, 2), GenerationConfig(max_new_tokens=51)))
    batcher.submit(BatchRequest(prompt(50, 3), GenerationConfig(max_new_tokens=51)))
    batcher.step()
    assert (batcher.running, batcher.waiting) == (1, 1)
    events = []
    while batcher.waiting:
        events.extend(batcher.step())
    assert any(e.sequence_id == first and e.finish is not None for e in events)
    batcher.run()
    assert max(s.sequences for s in batcher.steps) == 1


def test_the_reservation_schedule_follows_the_ladder_then_doubles() -> None:
    ladder = Ladder.parse("32,64,128")
    assert reservation_schedule(ladder, 512) == (32, 64, 128, 256, 512)
    assert reservation_schedule(ladder, 300) == (32, 64, 128, 256, 300)
    assert reservation_schedule(ladder, 128) == (32, 64, 128)
    with pytest.raises(BadRequestError, match="under the top rung"):
        reservation_schedule(ladder, 100)


def test_a_pool_at_its_budget_refuses_more_blocks(loader: PagedLoader) -> None:
    batcher = ContinuousBatcher(loader, max_sequences=1, kv_budget_tokens=128)
    pool = batcher.pool
    taken, migration = pool.take(4)
    assert migration is not None and pool.capacity_tokens == 128
    with pytest.raises(LadderError, match="do not fit the budget"):
        pool.take(1)
    pool.give_back(taken)
    assert pool.check() == [] and pool.capacity_tokens == 32
