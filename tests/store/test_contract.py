"""The promises of ``storage.BlobStorage``, one suite run against every level: the local
folder (``DiskStore``), the S3 remote on a real SeaweedFS server (``Remote``), and a toy
kept in memory (``MemoryStorage`` below, the whole interface in under 80 lines: a
second backend is that much work). Each level's own faults are injected from outside
(``Level.corrupt``); the local store's self-check is the oracle at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import obstore
import pytest
import xxhash
from s3server import new_prefix, remote_for

from ovspec.errors import BlobRefusedError, StoreError
from ovspec.store.disk import DiskStore
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.records import BlobRecord, ProducedBlob, Verdict
from ovspec.store.s3 import S3Backend
from ovspec.store.storage import BlobStorage, PutResult
from ovspec.store.tier import Tier

# -- a toy level ------------------------------------------------------------------------


class MemoryStorage:
    """Every blob in a dict (shared between views): the smallest honest level."""

    def __init__(self, shelf: dict[str, tuple[BlobRecord, bytes]], read_only: bool = False):
        self.shelf, self.read_only, self.location = shelf, read_only, "memory:"

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError("memory level is read-only here")

    def contains(self, key: BlobKey) -> bool:
        return key.hex in self.shelf

    def record(self, key: BlobKey) -> BlobRecord | None:
        found = self.shelf.get(key.hex)
        return found[0] if found is not None and found[0].components == key.components else None

    def get(self, key: BlobKey, dest: Path, *, max_bytes: int | None = None) -> BlobRecord | None:
        record = self.record(key)
        if record is None:
            return None
        if max_bytes is not None and record.size_bytes > max_bytes:
            raise BlobRefusedError(f"{key.hex[:12]} is over {max_bytes} bytes")
        data = self.shelf[key.hex][1]
        if xxhash.xxh3_128_hexdigest(data) != record.checksum:
            raise BlobRefusedError(f"{key.hex[:12]} does not match its record")
        dest.write_bytes(data)
        return record

    def put(self, key: BlobKey, source: Path, record: BlobRecord) -> PutResult:
        self._writable()
        data = source.read_bytes()
        if record.hex != key.hex or xxhash.xxh3_128_hexdigest(data) != record.checksum:
            raise ValueError(f"{source} is not what the record of {key.hex[:12]} says")
        if key.hex in self.shelf:
            return PutResult(stored=False, moved_bytes=0)
        self.shelf[key.hex] = (record, data)
        return PutResult(stored=True, moved_bytes=len(data))

    def remove(self, hex_: str) -> bool:
        self._writable()
        return self.shelf.pop(hex_, None) is not None

    def hexes(self) -> Iterator[str]:
        return iter(sorted(self.shelf))

    def verify(self, key: BlobKey) -> Verdict:
        found = self.shelf.get(key.hex)
        if found is None:
            return Verdict.MISSING
        ok = xxhash.xxh3_128_hexdigest(found[1]) == found[0].checksum
        return Verdict.OK if ok else Verdict.CORRUPT


# -- the three levels, with a way to damage each from outside ---------------------------------


@dataclass
class Level:
    storage: BlobStorage
    read_only_view: Callable[[], BlobStorage]
    corrupt: Callable[[BlobKey], None]  # flip one payload bit, keep the size


def flip(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1 :]


def disk_level(tmp_path: Path) -> Iterator[Level]:
    store = DiskStore(tmp_path / "store", strict=True)

    def corrupt(key: BlobKey) -> None:
        entry = store.record(key)
        assert entry is not None
        entry.path.write_bytes(flip(entry.path.read_bytes()))

    views: list[DiskStore] = []

    def read_only_view() -> BlobStorage:
        views.append(DiskStore(store.root, strict=True, trust_shared=True))
        return views[-1]

    yield Level(store, read_only_view, corrupt)
    assert store.check() == []
    for view in (*views, store):
        view.close()


def s3_level(request: pytest.FixtureRequest) -> Iterator[Level]:
    seaweed = request.getfixturevalue("seaweed")
    prefix = new_prefix()
    remote = remote_for(seaweed, prefix)

    def corrupt(key: BlobKey) -> None:
        manifest = remote.manifest(key)
        backend = remote.backend
        assert manifest is not None and isinstance(backend, S3Backend)
        name = S3Backend.payload_path(manifest.payload.sha256)
        obstore.put(backend._data, name, flip(bytes(obstore.get(backend._data, name).bytes())))

    yield Level(remote, lambda: remote_for(seaweed, prefix, read_only=True), corrupt)


def memory_level() -> Iterator[Level]:
    shelf: dict[str, tuple[BlobRecord, bytes]] = {}

    def corrupt(key: BlobKey) -> None:
        record, data = shelf[key.hex]
        shelf[key.hex] = (record, flip(data))

    yield Level(MemoryStorage(shelf), lambda: MemoryStorage(shelf, read_only=True), corrupt)


@pytest.fixture(params=["disk", "s3", "memory"])
def level(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Level]:
    if request.param == "disk":
        yield from disk_level(tmp_path)
    elif request.param == "s3":
        yield from s3_level(request)
    else:
        yield from memory_level()


# -- what every level promises -----------------------------------------------------------------


def make_key(tag: str) -> BlobKey:
    return BlobKey.from_values({name: f"{name}-{tag}" for name in COMPONENT_NAMES})


def payload_for(key: BlobKey, tmp_path: Path, data: bytes) -> tuple[Path, BlobRecord]:
    source = tmp_path / f"{key.hex}.src"
    source.write_bytes(data)
    record = BlobRecord(
        hex=key.hex,
        components=key.components,
        size_bytes=len(data),
        checksum=xxhash.xxh3_128_hexdigest(data),
        compile_s=1.5,
        metadata={"device": "CPU", "roles": "{}"},
    )
    return source, record


def facts(record: BlobRecord | None) -> tuple[object, ...]:
    """What every level keeps of a record (the local store's entries carry more)."""
    assert record is not None
    return (
        record.hex,
        record.components,
        record.size_bytes,
        record.checksum,
        record.compile_s,
        dict(record.metadata),
    )


def stored(level: Level, tag: str, tmp_path: Path, data: bytes) -> tuple[BlobKey, BlobRecord]:
    key = make_key(tag)
    source, record = payload_for(key, tmp_path, data)
    assert level.storage.put(key, source, record) == PutResult(stored=True, moved_bytes=len(data))
    return key, record


def test_a_key_never_stored_is_a_miss_everywhere(level: Level, tmp_path: Path) -> None:
    key, storage = make_key("absent"), level.storage
    dest = tmp_path / "dest"
    assert not storage.contains(key) and storage.record(key) is None
    assert storage.get(key, dest) is None and not dest.exists()
    assert storage.verify(key) is Verdict.MISSING
    assert not storage.remove(key.hex)


def test_a_put_payload_comes_back_byte_for_byte_with_its_record(
    level: Level, tmp_path: Path
) -> None:
    data = b"compiled blob " * 500
    key, record = stored(level, "round", tmp_path, data)
    storage = level.storage
    assert storage.contains(key)
    assert facts(storage.record(key)) == facts(record)
    got = storage.get(key, tmp_path / "dest")
    assert facts(got) == facts(record)
    assert (tmp_path / "dest").read_bytes() == data
    assert storage.verify(key) is Verdict.OK
    assert key.hex in set(storage.hexes())


def test_the_first_writer_of_a_key_wins(level: Level, tmp_path: Path) -> None:
    key, _ = stored(level, "race", tmp_path, b"first " * 100)
    (tmp_path / "second").mkdir()
    source, record = payload_for(key, tmp_path / "second", b"second " * 100)
    assert level.storage.put(key, source, record) == PutResult(stored=False, moved_bytes=0)
    assert level.storage.get(key, tmp_path / "dest") is not None
    assert (tmp_path / "dest").read_bytes() == b"first " * 100


def test_a_payload_that_is_not_what_its_record_says_is_not_taken(
    level: Level, tmp_path: Path
) -> None:
    key = make_key("liar")
    source, record = payload_for(key, tmp_path, b"honest bytes " * 100)
    source.write_bytes(b"other bytes! " * 100)  # same size, another checksum
    with pytest.raises(ValueError):
        level.storage.put(key, source, record)
    assert not level.storage.contains(key) and level.storage.record(key) is None


@pytest.mark.filterwarnings("ignore::ovspec.store.records.StoreWarning")  # the local level's
def test_corrupt_bytes_are_refused_never_copied_out(level: Level, tmp_path: Path) -> None:
    key, _ = stored(level, "rot", tmp_path, b"soon corrupt " * 400)
    level.corrupt(key)
    dest = tmp_path / "dest"
    with pytest.raises(BlobRefusedError):
        level.storage.get(key, dest)
    assert not dest.exists()


@pytest.mark.filterwarnings("ignore::ovspec.store.records.StoreWarning")
def test_verify_finds_corrupt_bytes(level: Level, tmp_path: Path) -> None:
    key, _ = stored(level, "check", tmp_path, b"soon corrupt " * 400)
    level.corrupt(key)
    assert level.storage.verify(key) is Verdict.CORRUPT


def test_a_size_bound_refuses_a_larger_payload_before_copying(level: Level, tmp_path: Path) -> None:
    data = b"x" * 4096
    key, _ = stored(level, "big", tmp_path, data)
    dest = tmp_path / "dest"
    with pytest.raises(BlobRefusedError, match="4095"):
        level.storage.get(key, dest, max_bytes=len(data) - 1)
    assert not dest.exists()
    assert level.storage.get(key, dest, max_bytes=len(data)) is not None


def test_remove_forgets_a_key(level: Level, tmp_path: Path) -> None:
    key, _ = stored(level, "gone", tmp_path, b"short-lived " * 100)
    other, _ = stored(level, "kept", tmp_path, b"long-lived " * 100)
    assert level.storage.remove(key.hex)
    assert not level.storage.contains(key) and level.storage.get(key, tmp_path / "d") is None
    assert not level.storage.remove(key.hex)
    assert set(level.storage.hexes()) == {other.hex}


def test_a_read_only_view_reads_and_refuses_every_write(level: Level, tmp_path: Path) -> None:
    key, record = stored(level, "shared", tmp_path, b"team blob " * 100)
    view = level.read_only_view()
    assert view.read_only and not level.storage.read_only
    assert facts(view.get(key, tmp_path / "dest")) == facts(record)
    other = make_key("new")
    source, other_record = payload_for(other, tmp_path, b"new blob " * 100)
    with pytest.raises(StoreError):
        view.put(other, source, other_record)
    with pytest.raises(StoreError):
        view.remove(key.hex)
    assert level.storage.contains(key) and not level.storage.contains(other)


# -- a second backend composes as the first does ---------------------------------------------


def test_a_toy_level_behind_the_local_store_serves_a_second_machine(tmp_path: Path) -> None:
    remote = MemoryStorage({})
    data = b"compiled once " * 300

    def produce(path: Path) -> ProducedBlob:
        path.write_bytes(data)
        return ProducedBlob(compile_s=2.0, metadata={"device": "CPU"}, size_bytes=len(data))

    def refuse(path: Path) -> ProducedBlob:
        raise AssertionError("the second machine compiled")

    key = make_key("fleet")
    with DiskStore(tmp_path / "a", strict=True) as first:
        tier = Tier(first, remote, strict=True)
        assert not tier.get_or_create(key, produce, None, False).hit
        tier.close()
    assert remote.contains(key)
    with DiskStore(tmp_path / "b", strict=True) as second:
        outcome = Tier(second, remote, strict=True).get_or_create(key, refuse, None, False)
        assert outcome.fetched and outcome.path.read_bytes() == data
        assert second.stats().remote.hits == 1 and second.check() == []
