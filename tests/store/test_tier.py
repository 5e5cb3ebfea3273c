"""Two local stores ("two machines") sharing one real remote (SeaweedFS): the second
builds nothing; a remote that is down, corrupt, foreign-signed or read-only only ever
loses a hit; uploads run in the background after the local commit."""

from __future__ import annotations

import hashlib
import mmap
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from s3server import OTHER_KEY, TEAM_KEY, down_remote, new_prefix, remote_for

import ovspec.runtime.decoding as decoding
from ovspec.compile import preparing as preparing_module
from ovspec.compile.compiler import Compiler
from ovspec.compile.prewarm import BuildPlan, BuildReport, run_build
from ovspec.errors import BadRequestError, RemoteUnavailableError
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import Phase, Specialization
from ovspec.ladder import Ladder
from ovspec.runtime.loader import EventKind
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.local import ProducedBlob, Store
from ovspec.store.remote import Remote
from ovspec.store.s3 import S3Backend
from ovspec.store.tier import RemoteWarning, TransferStatus
from ovspec.testing.seaweed import SeaweedServer

LADDER = Ladder((32, 64))


def plan_for(model_dir: Path) -> BuildPlan:
    return BuildPlan(
        model=ModelDir.open(model_dir),
        ladder=LADDER,
        phases=(Phase.DECODE, Phase.PREFILL),
        chunk_tokens=16,
        device="CPU",
        properties=EXACT_CPU_PROPERTIES,
        compression=Compression(),
    )


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[Store]]:
    """Local stores opened by ``machine``; each must check clean when the test ends."""
    opened: list[Store] = []
    yield opened
    for store in opened:
        if store.tier is not None:
            store.tier.wait_for_uploads()
        assert store.check() == []
        store.close()


def machine(opened: list[Store], root: Path, remote: Remote | None, **kwargs: bool) -> Store:
    store = Store(root, strict=True, remote=remote, **kwargs)
    opened.append(store)
    return store


def build(store: Store, model_dir: Path) -> BuildReport:
    report = run_build(plan_for(model_dir), store)
    assert store.tier is not None
    store.tier.wait_for_uploads()
    return report


@pytest.fixture
def no_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any compile or IR preparation fails the test: this machine must build nothing."""

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("this machine compiled (or prepared the IR)")

    monkeypatch.setattr(Compiler, "_compile_to", refuse)
    monkeypatch.setattr(preparing_module, "prepare_model", refuse)


def test_the_second_machine_builds_nothing(
    seaweed: SeaweedServer,
    tiny_dir: Path,
    tmp_path: Path,
    machines: list[Store],
    request: pytest.FixtureRequest,
) -> None:
    prefix = new_prefix()
    first = machine(machines, tmp_path / "a", remote_for(seaweed, prefix))
    built = build(first, tiny_dir)
    assert built.misses == 4 and built.fetched == 0
    assert first.stats().remote.uploads == 4
    assert first.stats().remote.uploaded_bytes == built.blob_bytes

    request.getfixturevalue("no_compiles")
    second = machine(machines, tmp_path / "b", remote_for(seaweed, prefix))
    fetched = build(second, tiny_dir)
    assert (fetched.fetched, fetched.misses, fetched.hits) == (4, 0, 0)
    assert fetched.compile_s == 0 and fetched.saved_s == pytest.approx(built.compile_s, abs=1e-5)
    remote_stats = second.stats().remote
    assert remote_stats.hits == 4 and remote_stats.uploads == 0
    assert remote_stats.fetched_bytes == built.blob_bytes
    assert remote_stats.saved_compile_s == pytest.approx(built.compile_s, abs=1e-5)
    again = build(second, tiny_dir)  # now local: plain hits
    assert (again.hits, again.fetched) == (4, 0)
    assert {e.metadata["fetched_from"] for e in second.entries()} == {f"s3://ovspec-test/{prefix}"}


def test_a_loader_on_a_fresh_machine_fetches_instead_of_compiling(
    seaweed: SeaweedServer,
    tiny_dir: Path,
    tmp_path: Path,
    machines: list[Store],
    request: pytest.FixtureRequest,
) -> None:
    prefix = new_prefix()
    build(machine(machines, tmp_path / "a", remote_for(seaweed, prefix)), tiny_dir)
    request.getfixturevalue("no_compiles")  # roles come from the manifest, not the IR
    fresh = machine(machines, tmp_path / "c", remote_for(seaweed, prefix))
    with decoding.open(
        tiny_dir,
        LADDER,
        properties=EXACT_CPU_PROPERTIES,
        store=fresh,
        prefill_chunk_tokens=16,
        load_mode="import",  # CPU's default compiles from the IR, past the store
    ) as loader:
        result = decoding.decode(loader, [1, 2, 3], max_new_tokens=40)
    kinds = {e.kind for e in result.events}
    assert EventKind.FETCHED in kinds and EventKind.COMPILED not in kinds
    assert result.rungs == (32, 64)
    fetched = [e.spec for e in result.events if e.kind is EventKind.FETCHED]
    assert "decode@64" in fetched  # the one-ahead successor came from the remote too


def test_a_remote_that_is_down_costs_one_warning_then_compiles(
    tiny_dir: Path, tmp_path: Path, machines: list[Store]
) -> None:
    store = machine(machines, tmp_path / "a", down_remote())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = build(store, tiny_dir)
    remote_warnings = [w for w in caught if issubclass(w.category, RemoteWarning)]
    assert len(remote_warnings) == 1, [str(w.message) for w in caught]
    assert "not asking the remote again" in str(remote_warnings[0].message)
    assert report.misses == 4 and report.fetched == 0
    assert store.stats().remote.failures == 1


def test_a_strict_remote_raises_instead(
    tiny_dir: Path, tmp_path: Path, machines: list[Store]
) -> None:
    store = machine(machines, tmp_path / "a", down_remote(), strict_remote=True)
    with pytest.raises(RemoteUnavailableError):
        run_build(plan_for(tiny_dir), store)


def test_a_corrupted_remote_payload_is_refused_recompiled_and_never_imported(
    seaweed: SeaweedServer,
    tiny_dir: Path,
    tmp_path: Path,
    machines: list[Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = new_prefix()
    remote_a = remote_for(seaweed, prefix)
    build(machine(machines, tmp_path / "a", remote_a), tiny_dir)
    spec = Specialization.decode(32)
    key = Compiler(ModelDir.open(tiny_dir), "CPU", EXACT_CPU_PROPERTIES, machines[0]).key(spec)
    manifest = remote_a.manifest(key)
    assert manifest is not None
    backend = remote_a.backend
    assert isinstance(backend, S3Backend)
    name = S3Backend.payload_path(manifest.payload.sha256)
    good = bytearray(obstore.get(backend._data, name).bytes())
    good[len(good) // 2] ^= 0x10  # one bit flipped, same size
    obstore.put(backend._data, name, bytes(good))
    corrupt_sha = hashlib.sha256(good).hexdigest()

    imported: list[str] = []
    original = Compiler._import

    def spy(self: Compiler, mapping: mmap.mmap, name: str) -> object:
        imported.append(hashlib.sha256(mapping[:]).hexdigest())
        return original(self, mapping, name)

    monkeypatch.setattr(Compiler, "_import", spy)
    second = machine(machines, tmp_path / "b", remote_for(seaweed, prefix))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = Compiler(ModelDir.open(tiny_dir), "CPU", EXACT_CPU_PROPERTIES, second).load(spec)
    messages = [str(w.message) for w in caught if issubclass(w.category, RemoteWarning)]
    assert len(messages) == 1 and "failed verification" in messages[0]
    assert not program.build.fetched and not program.build.hit  # compiled here
    assert imported and corrupt_sha not in imported
    assert second.stats().remote.refused == 1


def test_a_foreign_signature_is_refused_and_an_unsigned_client_takes_it(
    seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path, machines: list[Store]
) -> None:
    prefix = new_prefix()
    build(machine(machines, tmp_path / "a", remote_for(seaweed, prefix, keys=OTHER_KEY)), tiny_dir)
    signed = machine(machines, tmp_path / "b", remote_for(seaweed, prefix, keys=TEAM_KEY))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = build(signed, tiny_dir)
    messages = [str(w.message) for w in caught if issubclass(w.category, RemoteWarning)]
    assert report.fetched == 0 and report.misses == 4
    assert messages and all("signature does not match" in m for m in messages)
    assert signed.stats().remote.refused == 4
    unsigned = machine(machines, tmp_path / "c", remote_for(seaweed, prefix))
    assert build(unsigned, tiny_dir).fetched == 4


def test_a_read_only_remote_is_read_never_written(
    seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path, machines: list[Store]
) -> None:
    prefix = new_prefix()
    reader = machine(machines, tmp_path / "a", remote_for(seaweed, prefix, read_only=True))
    assert build(reader, tiny_dir).misses == 4
    assert list(remote_for(seaweed, prefix).hexes()) == []
    assert reader.stats().remote.uploads == 0


# -- the glue without a model: fake keys and payloads ------------------------------------------


def fake_key(tag: str) -> BlobKey:
    return BlobKey.from_values({name: f"{name}-{tag}" for name in COMPONENT_NAMES})


def writer(data: bytes, compile_s: float = 0.5) -> object:
    def produce(path: Path) -> ProducedBlob:
        path.write_bytes(data)
        return ProducedBlob(compile_s=compile_s, metadata={"what": "test"}, size_bytes=len(data))

    return produce


def test_uploads_run_on_a_background_thread_after_the_commit(
    seaweed: SeaweedServer, tmp_path: Path, machines: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = remote_for(seaweed, new_prefix())
    store = machine(machines, tmp_path / "a", remote)
    threads: list[str] = []
    committed: list[bool] = []
    original = Remote.publish

    def spy(self: Remote, key: BlobKey, *args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread().name)
        committed.append(store.peek(key))
        return original(self, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Remote, "publish", spy)
    outcome = store.get_or_create(fake_key("bg"), writer(b"payload" * 100))  # type: ignore[arg-type]
    assert outcome.stored and not outcome.fetched
    assert store.tier is not None
    store.tier.wait_for_uploads()
    assert threads and threads[0].startswith("ovspec-upload")
    assert committed == [True]  # the local entry existed before the upload began
    assert remote.contains(fake_key("bg"))


def test_push_and_pull_report_each_key(
    seaweed: SeaweedServer, tmp_path: Path, machines: list[Store]
) -> None:
    prefix = new_prefix()
    local_only = machine(machines, tmp_path / "a", None)
    for tag in ("x", "y"):
        local_only.get_or_create(fake_key(tag), writer(tag.encode() * 50))  # type: ignore[arg-type]
    pusher = machine(machines, tmp_path / "a", remote_for(seaweed, prefix))  # same folder
    assert pusher.tier is not None
    pushed = [pusher.tier.push(fake_key(t)) for t in ("x", "y", "z")]
    assert [p.status for p in pushed] == [
        TransferStatus.PUBLISHED,
        TransferStatus.PUBLISHED,
        TransferStatus.MISSING,
    ]
    assert pusher.tier.push(fake_key("x")).status is TransferStatus.ON_REMOTE
    puller = machine(machines, tmp_path / "b", remote_for(seaweed, prefix))
    assert puller.tier is not None
    pulled = [puller.tier.pull(fake_key(t), None) for t in ("x", "y", "z")]
    assert [p.status for p in pulled] == [
        TransferStatus.PULLED,
        TransferStatus.PULLED,
        TransferStatus.MISSING,
    ]
    assert pulled[0].moved_bytes == 50
    assert puller.tier.pull(fake_key("x"), None).status is TransferStatus.LOCAL
    assert puller.lookup(fake_key("y")) is not None
    down = machine(machines, tmp_path / "c", down_remote())
    assert down.tier is not None
    assert down.tier.pull(fake_key("x"), None).status is TransferStatus.UNAVAILABLE


def test_open_takes_a_remote_from_its_argument_or_the_environment(
    seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = remote_for(seaweed, new_prefix())
    blobs = {"load_mode": "import"}  # the store path, where a remote serves
    with decoding.open(tiny_dir, LADDER, store=tmp_path / "s", remote=remote, **blobs) as loader:
        tier = loader.store.tier
        assert tier is not None and tier.remote is remote
    monkeypatch.setenv("OVSPEC_REMOTE", "s3://team-cache/from-env")
    with decoding.open(tiny_dir, LADDER, store=tmp_path / "s", **blobs) as loader:
        tier = loader.store.tier
        assert tier is not None and tier.remote.url == "s3://team-cache/from-env"
    with Store(tmp_path / "t") as store, pytest.raises(BadRequestError, match="give remote="):
        decoding.open(tiny_dir, LADDER, store=store, remote=remote)
