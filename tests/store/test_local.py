"""Fault injection for every promise of ovspec.store.local; ``check()`` is the oracle.

Payloads are small random byte strings; keys are fake but complete BlobKeys.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from ovspec.errors import StoreError
from ovspec.store.index import Index
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.layout import StoreLayout
from ovspec.store.local import STORE_FORMAT_VERSION, ProducedBlob, Store, StoreWarning
from ovspec.store.locks import KeyLock


def make_key(seed: object, **overrides: str) -> BlobKey:
    values = {name: f"{seed}-{name}" for name in COMPONENT_NAMES}
    values.update(overrides)
    return BlobKey.from_values(values)


def writer(data: bytes, compile_s: float = 0.25) -> Callable[[Path], ProducedBlob]:
    def produce(path: Path) -> ProducedBlob:
        path.write_bytes(data)
        return ProducedBlob(compile_s=compile_s, metadata={"producer": "test"})

    return produce


def never(path: Path) -> ProducedBlob:
    raise AssertionError("produce must not run on a hit")


def payload(n: int = 4096) -> bytes:
    return os.urandom(n)


def put(store: Store, seed: object, data: bytes | None = None, compile_s: float = 0.25) -> Path:
    outcome = store.get_or_create(make_key(seed), writer(data or payload(), compile_s))
    assert outcome.stored and not outcome.hit
    return outcome.path


def delete_row(store: Store, hex_: str) -> bool:
    """Delete an index row as another process (or a damaged disk) would."""
    db = sqlite3.connect(store.root / "index" / "index.sqlite3", isolation_level=None)
    try:
        return db.execute("DELETE FROM entries WHERE hex = ?", (hex_,)).rowcount == 1
    finally:
        db.close()


def temps(store: Store) -> list[Path]:
    return sorted((store.root / "tmp").iterdir())


def quarantined(store: Store) -> list[Path]:
    return sorted((store.root / "quarantine").iterdir())


# -- the happy path and the layout -------------------------------------------------


def test_miss_then_hit_returns_the_same_verified_bytes(store: Store) -> None:
    data = payload()
    key = make_key("a")
    first = store.get_or_create(key, writer(data, compile_s=1.5))
    assert (first.hit, first.stored, first.compile_s) == (False, True, 1.5)
    assert first.path.read_bytes() == data
    second = store.get_or_create(key, never)
    assert (second.hit, second.path, second.compile_s) == (True, first.path, 1.5)
    assert second.metadata == {"producer": "test"}
    entry = store.lookup(key)
    assert entry is not None and entry.values() == key.values()
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.saved_s) == (2, 1, 3.0)
    assert (stats.entries, stats.stored_bytes) == (1, len(data))


def test_layout_on_disk(store: Store) -> None:
    key = make_key("layout")
    put(store, "layout", b"x" * 100)
    root = store.root
    assert (root / "FORMAT").read_text().strip() == f"ovspec-store {STORE_FORMAT_VERSION}"
    blob = root / "blobs" / key.hex[:2] / f"{key.hex}.blob"
    sidecar = json.loads(blob.with_suffix(".json").read_text())
    assert blob.stat().st_size == 100
    assert sidecar["size_bytes"] == 100 and sidecar["hex"] == key.hex
    assert dict(sidecar["components"]) == key.values()
    assert sidecar["metadata"] == {"producer": "test"}
    assert (root / "locks" / f"{key.hex}.lock").exists()
    assert temps(store) == []


# -- corruption: never returned, quarantined, rebuilt ----------------------------------


@pytest.mark.parametrize("damage", ["truncate", "flip_bit", "delete"])
def test_damaged_payload_is_a_miss_and_gets_rebuilt(store: Store, damage: str) -> None:
    key = make_key(damage)
    path = put(store, damage, payload(10_000))
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:5000])
    elif damage == "flip_bit":
        data = bytearray(path.read_bytes())
        data[1234] ^= 0x10
        path.write_bytes(bytes(data))
    else:
        path.unlink()

    with pytest.warns(StoreWarning, match="missing" if damage == "delete" else "corrupt"):
        assert store.lookup(key) is None
    assert store.entries() == []
    if damage == "delete":
        assert quarantined(store) == []
    else:
        assert len(quarantined(store)) == 2  # payload and sidecar, kept for a post-mortem
        assert store.stats().quarantined == 1
    assert store.check() == []

    fresh = payload(10_000)
    outcome = store.get_or_create(key, writer(fresh))
    assert not outcome.hit and outcome.path.read_bytes() == fresh


def test_check_reports_and_fixes_a_corrupt_payload(store: Store) -> None:
    path = put(store, "c", payload(2000))
    path.write_bytes(b"\0" * 2000)  # same size, other bytes: only the checksum sees it
    problems = store.check()
    assert len(problems) == 1 and "payload corrupt" in problems[0]
    assert store.check(fix=True) == problems
    assert store.entries() == [] and len(quarantined(store)) == 2


def test_deleted_index_row_self_heals_on_lookup(store: Store) -> None:
    key = make_key("row")
    data = payload()
    put(store, "row", data)
    assert delete_row(store, key.hex)
    assert store.entries() == []
    entry = store.lookup(key)  # verified against the sidecar, then re-indexed
    assert entry is not None and entry.path.read_bytes() == data
    assert [e.hex for e in store.entries()] == [key.hex]


def test_deleted_index_row_is_reindexed_by_check_fix(store: Store) -> None:
    key = make_key("row2")
    put(store, "row2")
    delete_row(store, key.hex)
    problems = store.check()
    assert len(problems) == 1 and "no index row (its sidecar verifies)" in problems[0]
    store.check(fix=True)
    assert store.get_or_create(key, never).hit


def test_deleted_sidecar_is_rewritten_from_the_row(store: Store) -> None:
    key = make_key("side")
    path = put(store, "side")
    path.with_suffix(".json").unlink()
    assert store.get_or_create(key, never).hit  # the row and the payload still agree
    problems = store.check()
    assert len(problems) == 1 and "sidecar missing" in problems[0]
    store.check(fix=True)
    assert json.loads(path.with_suffix(".json").read_text())["hex"] == key.hex


def test_sidecar_disagreeing_with_the_row_is_reported(store: Store) -> None:
    path = put(store, "dis", compile_s=2.0)
    sidecar = path.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    record["compile_s"] = 99.0
    sidecar.write_text(json.dumps(record))
    problems = store.check()
    assert len(problems) == 1 and "sidecar disagrees" in problems[0]
    store.check(fix=True)
    assert json.loads(sidecar.read_text())["compile_s"] == 2.0


def test_lost_row_and_sidecar_payload_is_overwritten_or_quarantined(store: Store) -> None:
    key = make_key("orphan")
    path = put(store, "orphan")
    delete_row(store, key.hex)
    path.with_suffix(".json").unlink()
    assert store.lookup(key) is None  # cannot be trusted without a sidecar
    problems = store.check()
    assert len(problems) == 1 and "no valid sidecar" in problems[0]
    # A producer simply replaces the orphan...
    fresh = payload()
    assert store.get_or_create(key, writer(fresh)).path.read_bytes() == fresh
    # ...and check(fix=True) quarantines one that nobody rebuilds.
    delete_row(store, key.hex)
    path.with_suffix(".json").unlink()
    store.check(fix=True)
    assert not path.exists() and len(quarantined(store)) == 1


def test_malformed_sidecar_is_quarantined_by_fix(store: Store) -> None:
    key = make_key("junk")
    path = put(store, "junk")
    delete_row(store, key.hex)
    path.with_suffix(".json").write_text("{not json")
    assert store.lookup(key) is None
    assert any("sidecar is malformed" in p for p in store.check())
    store.check(fix=True)
    assert not path.exists()


# -- producers that fail -----------------------------------------------------------


def test_producer_exception_stores_nothing_and_releases_the_lock(store: Store) -> None:
    key = make_key("boom")

    def produce(path: Path) -> ProducedBlob:
        path.write_bytes(b"half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        store.get_or_create(key, produce)
    assert store.entries() == [] and temps(store) == []
    lock = KeyLock(store.root / "locks" / f"{key.hex}.lock")
    assert lock.acquire(blocking=False)
    lock.release()
    assert not store.get_or_create(key, writer(b"ok")).hit


# -- concurrency ---------------------------------------------------------------------


def test_flock_excludes_threads_of_one_process(tmp_path: Path) -> None:
    # flock locks belong to open file descriptions: separate fds conflict even
    # within one process, which is what makes the store's lock work for threads.
    path = tmp_path / "k.lock"
    held = KeyLock(path)
    assert held.acquire(blocking=False)
    results: list[bool] = []
    t = threading.Thread(target=lambda: results.append(KeyLock(path).acquire(blocking=False)))
    t.start()
    t.join()
    assert results == [False]
    held.release()
    other = KeyLock(path)
    assert other.acquire(blocking=False)
    other.release()


def test_concurrent_threads_produce_once(store: Store) -> None:
    key = make_key("threads")
    data = payload()
    calls: list[int] = []
    start = threading.Barrier(6)

    def produce(path: Path) -> ProducedBlob:
        calls.append(1)
        time.sleep(0.2)  # hold the lock long enough for the others to queue
        path.write_bytes(data)
        return ProducedBlob(compile_s=0.2)

    # Three threads share the store object, three open their own on the same root.
    others = [Store(store.root, strict=True) for _ in range(3)]
    stores = [store, store, store, *others]
    outcomes = []

    def run(s: Store) -> None:
        start.wait()
        outcomes.append(s.get_or_create(key, produce))

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in others:
        s.close()
    assert len(calls) == 1
    assert sorted(o.hit for o in outcomes) == [False] + [True] * 5
    assert {o.path for o in outcomes} == {store.lookup(key).path}  # type: ignore[union-attr]
    assert all(o.path.read_bytes() == data for o in outcomes)


WORKER = r"""
import json, os, sys, time
from pathlib import Path
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.local import ProducedBlob, Store

root, seed, mode, scratch = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
key = BlobKey.from_values({n: f"{seed}-{n}" for n in COMPONENT_NAMES})
store = Store(root, strict=True)

def produce(path):
    with open(scratch / "calls", "a") as f:
        f.write(f"{os.getpid()}\n")
    if mode == "hang":
        with open(path, "wb") as f:
            f.write(b"x" * 5000)  # half the payload, then the process is killed
            f.flush()
        (scratch / "writing").touch()
        time.sleep(60)
    time.sleep(0.3)
    path.write_bytes(b"y" * 10000)
    return ProducedBlob(compile_s=0.3)

(scratch / f"started-{os.getpid()}").touch()
while mode == "race" and not (scratch / "go").exists():
    time.sleep(0.005)
out = store.get_or_create(key, produce)
print(json.dumps({"hit": out.hit, "path": str(out.path), "wait_s": out.wait_s}))
"""


def spawn(store: Store, seed: str, mode: str, scratch: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(store.root), seed, mode, str(scratch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_produce_once(store: Store, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    procs = [spawn(store, "race", "race", scratch) for _ in range(2)]
    wait_until(lambda: len(list(scratch.glob("started-*"))) == 2, "both workers", 20.0)
    (scratch / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert len((scratch / "calls").read_text().split()) == 1
    assert sorted(r["hit"] for r in results) == [False, True]
    assert len({r["path"] for r in results}) == 1
    assert store.stats().misses == 1 and store.stats().hits == 1


def test_process_killed_mid_write_leaves_no_entry(store: Store, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    key = make_key("killed")
    proc = spawn(store, "killed", "hang", scratch)
    wait_until((scratch / "writing").exists, "the writer", 20.0)
    # The half-written temp exists while the producer lives; check() leaves it alone.
    assert len(temps(store)) == 1
    assert store.check() == []
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    assert store.lookup(key) is None
    lock = KeyLock(store.root / "locks" / f"{key.hex}.lock")
    assert lock.acquire(blocking=False), "the kernel must release a dead holder's flock"
    lock.release()
    problems = store.check()
    assert len(problems) == 1 and "stale temp file" in problems[0]
    store.check(fix=True)
    assert temps(store) == []
    assert not store.get_or_create(key, writer(b"z" * 10)).hit


def test_check_skips_a_write_in_progress(store: Store) -> None:
    key = make_key("slow")
    entered, finish = threading.Event(), threading.Event()

    def produce(path: Path) -> ProducedBlob:
        path.write_bytes(b"partial")
        entered.set()
        finish.wait(10)
        path.write_bytes(b"complete")
        return ProducedBlob(compile_s=0.1)

    t = threading.Thread(target=store.get_or_create, args=(key, produce))
    t.start()
    assert entered.wait(10)
    assert store.check() == []  # the key's lock is held: not stale, not an orphan
    assert store.gc().repaired == ()
    assert len(temps(store)) == 1
    finish.set()
    t.join()
    assert store.get_or_create(key, never).path.read_bytes() == b"complete"


# -- storage failures: fail open, or raise when strict -------------------------------


def break_renames_into_blobs(store: Store, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Make renames into blobs/ fail as a full or read-only disk would.

    chmod cannot be used: the suite may run as root, which ignores permissions.
    """
    real_replace = os.replace
    blobs = str(store.root / "blobs")

    def replace(src: object, dst: object, **kwargs: object) -> None:
        if str(dst).startswith(blobs):
            raise OSError(err, os.strerror(err), str(dst))
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_unwritable_store_fails_open(
    store: Store, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    lenient = Store(store.root, strict=False)
    key = make_key("full")
    data = payload()
    break_renames_into_blobs(store, monkeypatch, err)
    with pytest.warns(StoreWarning, match="cannot store blob"):
        outcome = lenient.get_or_create(key, writer(data))
    monkeypatch.undo()
    assert not outcome.stored and not outcome.hit
    assert outcome.path.read_bytes() == data  # the caller still gets a usable blob
    assert store.root not in outcome.path.parents
    assert store.entries() == [] and temps(store) == []
    assert not (store.root / "blobs" / key.hex[:2] / f"{key.hex}.json").exists()
    outcome.discard()
    assert not outcome.path.parent.exists()  # the private folder goes with the payload
    lenient.close()


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_unwritable_store_raises_when_strict(
    store: Store, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    break_renames_into_blobs(store, monkeypatch, err)
    with pytest.raises(StoreError, match="cannot store blob"):
        store.get_or_create(make_key("strict"), writer(payload()))
    monkeypatch.undo()
    assert store.entries() == [] and temps(store) == []


def test_failure_after_the_rename_rolls_back(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # The index write fails after the payload and sidecar are in place.
    lenient = Store(store.root, strict=False)
    data = payload()

    def broken_set(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Index, "set_row", broken_set)
    with pytest.warns(StoreWarning):
        outcome = lenient.get_or_create(make_key("late"), writer(data))
    assert not outcome.stored and outcome.path.read_bytes() == data
    assert list((store.root / "blobs").glob("*/*")) == [] and temps(store) == []
    outcome.discard()
    lenient.close()


def test_unwritable_temp_folder_fails_open(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    lenient = Store(store.root, strict=False)
    data = payload()

    def no_temp(self: StoreLayout, hex_: str, suffix: str) -> Path:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(StoreLayout, "new_temp", no_temp)
    with pytest.warns(StoreWarning, match="cannot write"):
        outcome = lenient.get_or_create(make_key("notmp"), writer(data))
    assert not outcome.stored and outcome.path.read_bytes() == data
    outcome.discard()
    lenient.close()


def test_root_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StoreError, match=r"is not writable .*root=.*OVSPEC_CACHE_DIR"):
        Store(blocker / "store")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_root_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="is not writable"):
            Store(root)
    finally:
        root.chmod(0o700)


def test_newer_or_unknown_format_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    Store(root).close()
    (root / "FORMAT").write_text(f"ovspec-store {STORE_FORMAT_VERSION + 1}\n")
    with pytest.raises(StoreError, match=f"format {STORE_FORMAT_VERSION + 1}, written by a newer"):
        Store(root)
    (root / "FORMAT").write_text("something else\n")
    with pytest.raises(StoreError, match="not an ovspec store"):
        Store(root)


def test_foreign_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("not ours")
    with pytest.raises(StoreError, match="not an ovspec store"):
        Store(tmp_path)


# -- eviction, statistics, maintenance -------------------------------------------------


def test_lru_eviction_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", strict=True, size_limit_bytes=3500)
    keys = [make_key(i) for i in range(4)]
    for i in range(3):
        put(store, i, payload(1000))
    assert store.lookup(keys[0]) is not None  # 0 is now more recent than 1 and 2
    put(store, 3, payload(1000))
    assert {e.hex for e in store.entries()} == {keys[0].hex, keys[2].hex, keys[3].hex}
    put(store, 4, payload(1000))
    assert {e.hex for e in store.entries()} == {keys[0].hex, keys[3].hex, make_key(4).hex}
    assert store.stats().evictions == 2
    assert store.check() == []
    store.close()


def test_blob_over_the_limit_is_kept_with_a_warning(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", strict=True, size_limit_bytes=1000)
    put(store, "small", payload(600))
    with pytest.warns(StoreWarning, match="over its size limit"):
        big = put(store, "big", payload(5000))
    assert [e.path for e in store.entries()] == [big]  # the just-written one stays
    assert store.check() == []
    store.close()


def test_size_limit_is_persisted(tmp_path: Path) -> None:
    Store(tmp_path / "s", size_limit_bytes=12345).close()
    with Store(tmp_path / "s") as again:
        assert again.size_limit_bytes == 12345
    with pytest.raises(StoreError, match="size limit"):
        Store(tmp_path / "s", size_limit_bytes=0)


def test_stats_are_shared_between_instances(store: Store) -> None:
    put(store, "shared", compile_s=2.5)
    with Store(store.root, strict=True) as other:
        assert other.get_or_create(make_key("shared"), never).hit
        assert other.lookup(make_key("absent")) is None
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.saved_s, stats.entries) == (1, 2, 2.5, 1)


def test_gc_evicts_and_cleans(store: Store) -> None:
    for i in range(3):
        put(store, i, payload(1000))
    stale = store.root / "tmp" / f"{make_key('dead').hex}.4242.abcd.blob.part"
    stale.write_bytes(b"leftover")
    dead_lock = store.root / "locks" / f"{make_key('dead').hex}.lock"
    dead_lock.touch()
    store.set_size_limit(2500)
    assert any("over its size limit" in p for p in store.check())
    report = store.gc()
    assert (report.evicted_entries, report.freed_bytes) == (1, 1000)
    assert any("stale temp file" in p for p in report.repaired)
    assert not stale.exists() and not dead_lock.exists()
    assert report.locks_removed >= 2  # the dead key's and the evicted entry's
    assert len(store.entries()) == 2


def test_find_remove_clear(store: Store) -> None:
    hexes = {}
    seed = 0
    while len(hexes) < 2 or len({h[0] for h in hexes.values()}) == len(hexes):
        hexes[seed] = make_key(seed).hex
        seed += 1
    for s in hexes:
        put(store, s, payload(100))
    first = next(iter(hexes.values()))
    assert store.find(first[:20].upper()).hex == first
    with pytest.raises(StoreError, match="no entry matches 'zz'"):
        store.find("zz")
    shared = next(h[0] for h in hexes.values() if sum(x[0] == h[0] for x in hexes.values()) > 1)
    with pytest.raises(StoreError, match="ambiguous"):
        store.find(shared)
    assert store.remove(first) and not store.remove(first)
    assert store.lookup(make_key(next(iter(hexes)))) is None
    assert store.clear() == len(hexes) - 1
    assert store.entries() == [] and store.stats().hits == 0
    assert list((store.root / "blobs").glob("*/*")) == []


def test_default_root_honours_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OVSPEC_CACHE_DIR", str(tmp_path / "env"))
    assert Store.default_root() == tmp_path / "env"
    monkeypatch.delenv("OVSPEC_CACHE_DIR")
    assert Store.default_root().name == "ovspec"


def test_lock_file_unlinked_by_gc_is_not_shared(tmp_path: Path) -> None:
    # gc unlinks idle lock files while holding them; a waiter that opened the
    # old inode must notice and reopen, or two holders could coexist.
    path = tmp_path / "k.lock"
    gc_lock, waiter_lock = KeyLock(path), KeyLock(path)
    assert gc_lock.acquire(blocking=False)
    waiter = threading.Thread(target=waiter_lock.acquire, kwargs={"blocking": True})
    waiter.start()
    time.sleep(0.05)  # let the waiter block on the old inode (harmless if it has not yet)
    path.unlink()
    gc_lock.release()
    waiter.join(5)
    assert not waiter.is_alive()
    third = KeyLock(path)
    assert not third.acquire(blocking=False)  # the waiter holds the path's current inode
    waiter_lock.release()
    assert third.acquire(blocking=False)
    third.release()
