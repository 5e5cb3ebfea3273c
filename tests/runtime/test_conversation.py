"""Conversations: turns keep the KV (each prefills only its own tokens) and equal one
generate over the whole conversation on both paths; forks, slides, prefix-cache hits and
saved sessions give exactly what recomputing gives; damaged or foreign files are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ovspec
from ovspec.errors import BadRequestError
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.conversation import Conversation, Overflow
from ovspec.runtime.generation import generate
from ovspec.runtime.loader import Loader
from ovspec.runtime.paged import PagedLoader
from ovspec.runtime.prefixcache import PrefixCache
from ovspec.runtime.sampling import GenerationConfig
from ovspec.store.local import Store

GREEDY = GenerationConfig(max_new_tokens=9, ignore_eos=True)
# Five user turns; with 9 answers each the conversation crosses 32 inside turn 3's
# prefill and 64 inside turn 5's decode.
TURNS = ([5, 6, 7, 8, 9, 10, 11], [20, 21, 22], list(range(30, 42)), [50], [60, 61, 62, 63, 64])
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["paged", "compile"])
def loader(
    request: pytest.FixtureRequest, qwen2_dir: Path, store: Store
) -> Iterator[Loader | PagedLoader]:
    with ovspec.open(
        qwen2_dir,
        ladder="32,64,128",
        load_mode=str(request.param),
        prefill_chunk_tokens=8,
        properties=EXACT_CPU_PROPERTIES,
        store=store,
    ) as opened:
        yield opened


def test_five_turns_equal_one_generate_over_the_whole_conversation(
    loader: Loader | PagedLoader,
) -> None:
    history: list[int] = []
    rungs = []
    with Conversation(loader) as conversation:
        for i, user in enumerate(TURNS):
            conversation.append(user)
            history += user
            turn = conversation.generate(GREEDY)
            assert turn.token_ids == generate(loader, history, GREEDY).token_ids
            # Only this turn's tokens (and the last answer's final token) were prefilled.
            assert turn.prefilled_tokens == len(user) + (1 if i else 0)
            history += turn.token_ids
            rungs.append((turn.capacity_tokens, turn.boundaries))
        assert conversation.tokens == history
        assert conversation.live_tokens == len(history) - 1
    assert rungs[2] == (64, 1) and rungs[4] == (128, 1)  # in a prefill, in a decode


def test_a_fork_shares_the_past_and_goes_its_own_way(loader: Loader | PagedLoader) -> None:
    with Conversation(loader) as conversation:
        conversation.append(TURNS[0])
        first = conversation.generate(GREEDY)
        with conversation.fork() as fork:
            fork.append([70, 71])
            forked = fork.generate(GREEDY)
            assert forked.prefilled_tokens == 3
            sampled = GenerationConfig(max_new_tokens=5, do_sample=True, rng_seed=3)
            conversation.append([70, 71])
            assert conversation.generate(GREEDY).token_ids == forked.token_ids
            fork.append([80])
            conversation.append([80])
            assert fork.generate(sampled).token_ids == conversation.generate(sampled).token_ids
        expected = [*TURNS[0], *first.token_ids, 70, 71]
        assert generate(loader, expected, GREEDY).token_ids == forked.token_ids


def test_past_the_top_rung_refuse_says_so_and_slide_equals_a_fresh_run(
    loader: Loader | PagedLoader,
) -> None:
    config = GenerationConfig(max_new_tokens=150, ignore_eos=True)
    with Conversation(loader) as refusing:
        refusing.append(list(range(1, 21)))
        with pytest.raises(BadRequestError, match="over the top rung 128"):
            refusing.generate(config)
    with Conversation(loader, Overflow.SLIDE, keep_first_tokens=4) as sliding:
        sliding.append(list(range(1, 21)))
        turn = sliding.generate(config)
    assert len(turn.token_ids) == 150 and len(turn.slides) == 1
    slide = turn.slides[0]
    assert slide.at_tokens == 129 and len(slide.kept_ids) == 4 + 62
    assert slide.kept_ids[:4] == (1, 2, 3, 4)
    after = 129 - 20  # tokens chosen up to the slide (the last of them is kept)
    rest = GenerationConfig(max_new_tokens=150 - after, ignore_eos=True)
    fresh = generate(loader, slide.kept_ids, rest)
    assert turn.token_ids[after:] == fresh.token_ids


def test_a_prefix_cache_hit_equals_its_recomputation(
    loader: Loader | PagedLoader, store: Store
) -> None:
    system = list(range(100, 140))  # over the first rung: the hit lands on rung 64
    cache = PrefixCache(store)
    answers = []
    for _ in range(2):
        with Conversation(loader, prefix_cache=cache) as conversation:
            conversation.append(system, cache_prefix=True)
            conversation.append([7, 8, 9])
            answers.append(conversation.generate(GREEDY))
    cold, warm = answers
    assert (cold.reused_tokens, warm.reused_tokens) == (0, 40)
    assert warm.prefilled_tokens == 3 and cache.hits == 1
    assert (
        cold.token_ids == warm.token_ids == generate(loader, [*system, 7, 8, 9], GREEDY).token_ids
    )
    # A cache with nothing in memory finds the prefix in the store.
    from_store = PrefixCache(store)
    with Conversation(loader, prefix_cache=from_store) as conversation:
        conversation.append(system, cache_prefix=True)
        conversation.append([7, 8, 9])
        assert conversation.generate(GREEDY).token_ids == cold.token_ids
    assert from_store.hits == 1


_CONTINUE = """
import json, sys
import ovspec
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime.conversation import Conversation
from ovspec.runtime.sampling import GenerationConfig
model, mode, store, path = sys.argv[1:5]
with ovspec.open(model, ladder="32,64,128", load_mode=mode, prefill_chunk_tokens=8,
                 properties=EXACT_CPU_PROPERTIES, store=store) as loader:
    with Conversation(loader) as conversation:
        notes = conversation.load(path)
        conversation.append([40, 41])
        turn = conversation.generate(GenerationConfig(max_new_tokens=9, ignore_eos=True))
        print(json.dumps({"notes": notes, "tokens": list(turn.token_ids),
                          "prefilled": turn.prefilled_tokens}))
"""


def test_a_saved_session_continues_in_another_process(
    loader: Loader | PagedLoader, tmp_path: Path, qwen2_dir: Path, store: Store
) -> None:
    saved = tmp_path / "chat.ovsession"
    with Conversation(loader) as conversation:
        for user in TURNS[:3]:
            conversation.append(user)
            conversation.generate(GREEDY)
        conversation.save(saved, notes={"title": "three turns"})
        conversation.append([40, 41])
        expected = conversation.generate(GREEDY).token_ids
    mode = "paged" if isinstance(loader, PagedLoader) else "compile"
    out = subprocess.run(
        [sys.executable, "-c", _CONTINUE, str(qwen2_dir), mode, str(store.root), str(saved)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    answer = json.loads(out.stdout)
    assert answer == {"notes": {"title": "three turns"}, "tokens": list(expected), "prefilled": 3}


def test_damaged_truncated_and_foreign_sessions_are_refused_in_one_line(
    loader: Loader | PagedLoader, tmp_path: Path
) -> None:
    saved = tmp_path / "chat.ovsession"
    with Conversation(loader) as conversation:
        conversation.append(TURNS[0])
        conversation.generate(GREEDY)
        conversation.save(saved)
        data = saved.read_bytes()
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x40
        cases = {
            "damaged": (bytes(flipped), "damaged or truncated"),
            "truncated": (data[: len(data) - 100], "damaged or truncated"),
            "not a session": (b"hello", "not an ovspec session file"),
        }
        for name, (content, message) in cases.items():
            bad = tmp_path / name
            bad.write_bytes(content)
            with pytest.raises(BadRequestError, match=message) as refused:
                conversation.load(bad)
            assert "\n" not in str(refused.value)
        # Still the conversation it was: a refused load changes nothing.
        assert conversation.live_tokens == len(TURNS[0]) + 8
        identity = conversation.identity()
    from ovspec.store import sessions

    foreign = sessions.read_file(saved)
    other = {**identity, "weights": "0" * 32}
    sessions.write_file(
        tmp_path / "foreign",
        sessions.SavedSession(other, foreign.tokens, foreign.live_tokens, foreign.arrays, {}),
    )
    with Conversation(loader) as fresh, pytest.raises(BadRequestError, match="differs in weights"):
        fresh.load(tmp_path / "foreign")
