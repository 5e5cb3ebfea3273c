"""The remote against a real S3 server (SeaweedFS): round trip, publishing that never
clobbers, verification of everything a server sends, signatures, read-only clients,
and faults (server down, hung, killed; an uploader killed mid-way)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import obstore
import pytest
from s3server import (
    BUCKET,
    OTHER_KEY,
    TEAM_KEY,
    down_remote,
    new_prefix,
    remote_for,
    settings_for,
    write_payload,
)

from ovspec.errors import (
    RemoteIntegrityError,
    RemoteReadOnlyError,
    RemoteSignatureError,
    RemoteUnavailableError,
)
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.manifest import describe_payload, new_manifest
from ovspec.store.remote import PublishOutcome, Remote
from ovspec.store.s3 import S3Backend
from ovspec.testing.seaweed import SeaweedServer


def make_key(tag: str) -> BlobKey:
    return BlobKey.from_values({name: f"{name}-{tag}" for name in COMPONENT_NAMES})


def publish(remote: Remote, key: BlobKey, path: Path, compile_s: float = 2.0) -> PublishOutcome:
    with path.open("rb") as f:
        return remote.publish(key, f, compile_s, {"device": "CPU"}).outcome


def raw(remote: Remote) -> obstore.store.S3Store:
    """The backend's own client: what a hostile or broken server could do to the bucket."""
    backend = remote.backend
    assert isinstance(backend, S3Backend)
    return backend._data


@pytest.fixture
def remote(seaweed: SeaweedServer) -> Remote:
    return remote_for(seaweed, new_prefix(), multipart_chunk_bytes=5 << 20)


def test_publish_then_fetch(remote: Remote, tmp_path: Path) -> None:
    key = make_key("round")
    src = write_payload(tmp_path / "src", 12 << 20)  # > one 5 MiB part: multipart
    assert remote.fetch(key, tmp_path / "none") is None
    assert not (tmp_path / "none").exists()
    with src.open("rb") as f:
        published = remote.publish(key, f, 3.0, {"device": "CPU"})
    assert published.outcome is PublishOutcome.PUBLISHED
    assert published.uploaded_bytes == 12 << 20
    assert remote.contains(key) and list(remote.hexes()) == [key.hex]
    fresh = Remote(remote.backend)  # another client: no manifest cached
    m = fresh.fetch(key, tmp_path / "got")
    assert m is not None and m.compile_s == 3.0 and m.metadata == {"device": "CPU"}
    assert (tmp_path / "got").read_bytes() == src.read_bytes()


def test_a_second_publisher_never_clobbers(remote: Remote, tmp_path: Path) -> None:
    key = make_key("clobber")
    first = write_payload(tmp_path / "a", 3000)
    second = write_payload(tmp_path / "b", 4000)
    assert publish(remote, key, first) is PublishOutcome.PUBLISHED
    assert publish(remote, key, second) is PublishOutcome.ALREADY_PUBLISHED
    # Past the early check, the conditional put itself refuses.
    with second.open("rb") as f:
        manifest = new_manifest(key, describe_payload(f), 1.0, {})
    assert not remote.backend.create_manifest(key.hex, manifest.to_bytes())
    Remote(remote.backend).fetch(key, tmp_path / "got")
    assert (tmp_path / "got").read_bytes() == first.read_bytes()


def test_racing_publishers_exactly_one_wins(remote: Remote, tmp_path: Path) -> None:
    key = make_key("race")
    writers = 6
    paths = [write_payload(tmp_path / f"p{i}", 100_000 + i) for i in range(writers)]
    manifests = []
    for i, path in enumerate(paths):
        with path.open("rb") as f:
            manifests.append(new_manifest(key, describe_payload(f), 1.0, {"writer": str(i)}))
    barrier = threading.Barrier(writers)
    won: list[bool] = [False] * writers

    def go(i: int) -> None:
        with paths[i].open("rb") as f:
            remote.backend.write_payload(manifests[i].payload.sha256, 100_000 + i, f)
        barrier.wait()
        won[i] = remote.backend.create_manifest(key.hex, manifests[i].to_bytes())

    threads = [threading.Thread(target=go, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 1
    winner = won.index(True)
    m = Remote(remote.backend).fetch(key, tmp_path / "got")
    assert m is not None and m.metadata == {"writer": str(winner)}
    assert (tmp_path / "got").read_bytes() == paths[winner].read_bytes()


# -- an untrusted server: everything it sends is checked -----------------------------------


def test_a_corrupted_payload_is_refused_and_nothing_is_kept(remote: Remote, tmp_path: Path) -> None:
    key = make_key("corrupt")
    src = write_payload(tmp_path / "src", 1 << 20)
    publish(remote, key, src)
    m = remote.manifest(key)
    assert m is not None
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    obstore.put(raw(remote), S3Backend.payload_path(m.payload.sha256), bytes(data))
    dest = tmp_path / "got"
    with pytest.raises(RemoteIntegrityError, match="failed verification"):
        Remote(remote.backend).fetch(key, dest)
    assert not dest.exists()


def test_a_payload_of_another_size_or_none_is_refused(remote: Remote, tmp_path: Path) -> None:
    key = make_key("size")
    publish(remote, key, write_payload(tmp_path / "src", 50_000))
    m = remote.manifest(key)
    assert m is not None
    name = S3Backend.payload_path(m.payload.sha256)
    obstore.put(raw(remote), name, b"x" * 60_000)
    with pytest.raises(RemoteIntegrityError, match="60000 bytes; its manifest says 50000"):
        remote.fetch(key, tmp_path / "got")
    obstore.delete(raw(remote), name)
    with pytest.raises(RemoteIntegrityError, match="which the remote lacks"):
        remote.fetch(key, tmp_path / "got")
    assert not (tmp_path / "got").exists()


def test_a_manifest_copied_under_another_key_is_refused(remote: Remote, tmp_path: Path) -> None:
    a, b = make_key("a"), make_key("b")
    publish(remote, a, write_payload(tmp_path / "src", 1000))
    copied = bytes(obstore.get(raw(remote), S3Backend.manifest_path(a.hex)).bytes())
    obstore.put(raw(remote), S3Backend.manifest_path(b.hex), copied)
    with pytest.raises(RemoteIntegrityError, match="describes another key"):
        remote.fetch(b, tmp_path / "got")


def test_junk_and_huge_manifests_are_refused(remote: Remote, tmp_path: Path) -> None:
    key = make_key("junk")
    obstore.put(raw(remote), S3Backend.manifest_path(key.hex), b"{not json")
    with pytest.raises(RemoteIntegrityError, match="malformed manifest"):
        remote.fetch(key, tmp_path / "got")
    big = make_key("big")
    obstore.put(raw(remote), S3Backend.manifest_path(big.hex), b" " * ((1 << 20) + 1))
    with pytest.raises(RemoteIntegrityError, match="not reading it"):
        remote.fetch(big, tmp_path / "got")


def test_signatures_on_the_wire(seaweed: SeaweedServer, tmp_path: Path) -> None:
    prefix = new_prefix()
    signed = remote_for(seaweed, prefix, keys=TEAM_KEY)
    unsigned = remote_for(seaweed, prefix)
    foreign = remote_for(seaweed, prefix, keys=OTHER_KEY)
    src = write_payload(tmp_path / "src", 10_000)

    good = make_key("signed")
    publish(signed, good, src)
    assert remote_for(seaweed, prefix, keys=TEAM_KEY).fetch(good, tmp_path / "1") is not None
    assert unsigned.fetch(good, tmp_path / "2") is not None  # no key: cannot check, accepts

    plain = make_key("plain")
    publish(unsigned, plain, src)
    with pytest.raises(RemoteSignatureError, match="unsigned"):
        signed.fetch(plain, tmp_path / "3")

    other = make_key("other")
    publish(foreign, other, src)
    with pytest.raises(RemoteSignatureError, match="does not match"):
        signed.fetch(other, tmp_path / "4")

    # Someone with write access to the bucket but not the key points a signed manifest
    # at their own payload: an unsigned client cannot tell, a signed one refuses.
    evil = write_payload(tmp_path / "evil", 10_000)
    with evil.open("rb") as f:
        forged_ref = describe_payload(f)
    obj = json.loads(bytes(obstore.get(raw(signed), S3Backend.manifest_path(good.hex)).bytes()))
    obj["payload"] = forged_ref.to_json()
    obstore.put(raw(signed), S3Backend.payload_path(forged_ref.sha256), evil.read_bytes())
    obstore.put(raw(signed), S3Backend.manifest_path(good.hex), json.dumps(obj).encode())
    with pytest.raises(RemoteSignatureError, match="does not match"):
        remote_for(seaweed, prefix, keys=TEAM_KEY).fetch(good, tmp_path / "5")
    assert not (tmp_path / "5").exists()
    assert remote_for(seaweed, prefix).fetch(good, tmp_path / "6") is not None


def test_read_only_clients_never_write(seaweed: SeaweedServer, tmp_path: Path) -> None:
    prefix = new_prefix()
    src = write_payload(tmp_path / "src", 1000)
    client_side = remote_for(seaweed, prefix, read_only=True)
    with pytest.raises(RemoteReadOnlyError), src.open("rb") as f:
        client_side.publish(make_key("ro"), f, 1.0, {})
    with pytest.raises(RemoteReadOnlyError):
        client_side.backend.write_payload("0" * 64, 1, io.BytesIO(b"x"))
    server_side = remote_for(seaweed, prefix, reader=True)  # an identity with Read, List only
    with pytest.raises(RemoteUnavailableError, match="permission denied"), src.open("rb") as f:
        server_side.publish(make_key("ro"), f, 1.0, {})
    assert list(remote_for(seaweed, prefix).hexes()) == []
    publish(remote_for(seaweed, prefix), make_key("ro"), src)
    assert client_side.fetch(make_key("ro"), tmp_path / "a") is not None
    assert server_side.fetch(make_key("ro"), tmp_path / "b") is not None


# -- faults -------------------------------------------------------------------------------


def test_a_server_that_is_down_is_unavailable(tmp_path: Path) -> None:
    remote = down_remote()
    with pytest.raises(RemoteUnavailableError):
        remote.fetch(make_key("down"), tmp_path / "got")
    with pytest.raises(RemoteUnavailableError), write_payload(tmp_path / "src", 10).open("rb") as f:
        remote.publish(make_key("down"), f, 1.0, {})
    assert not (tmp_path / "got").exists()


def test_a_hung_server_is_unavailable_until_it_answers(
    seaweed: SeaweedServer, tmp_path: Path
) -> None:
    # The session's server, paused and resumed: a second server would cost seconds.
    # Only the fetch made while it is paused has the short timeout: a busy machine, or a
    # server just resumed, may take more than a second to answer the others.
    prefix = new_prefix()
    patient = remote_for(seaweed, prefix, metadata_timeout_s=30.0)
    key = make_key("hung")
    publish(patient, key, write_payload(tmp_path / "src", 1000))
    hasty = remote_for(seaweed, prefix, metadata_timeout_s=1.0, max_retries=0)
    seaweed.pause()  # SIGSTOP: the kernel accepts connections, nothing answers
    try:
        with pytest.raises(RemoteUnavailableError):
            hasty.fetch(key, tmp_path / "got")
    finally:
        seaweed.resume()
    assert patient.fetch(key, tmp_path / "got") is not None


_UPLOADER = textwrap.dedent(
    """
    import io, sys, time
    from pathlib import Path
    from ovspec.store.keys import COMPONENT_NAMES, BlobKey
    from ovspec.store.remote import Remote
    from ovspec.store.s3 import S3Backend, S3Settings

    class PacedBody(io.RawIOBase):
        # The payload file, read at full speed while it is hashed; once read back from
        # its start for the upload, it says "body" and then yields 1 MiB every 50 ms, so
        # the test's kill lands mid-stream on any machine.
        def __init__(self, path):
            self.file, self.size, self.hashed, self.said = open(path, "rb"), 0, False, False
        def readable(self): return True
        def seekable(self): return True
        def tell(self): return self.file.tell()
        def seek(self, offset, whence=0):
            self.hashed = self.hashed or self.file.tell() >= self.size > 0
            return self.file.seek(offset, whence)
        def readinto(self, buffer):
            if not self.hashed:
                n = self.file.readinto(buffer)
                self.size = max(self.size, self.file.tell())
                return n
            if not self.said:
                print("body", flush=True)
                self.said = True
            time.sleep(0.05)
            with memoryview(buffer) as view:
                return self.file.readinto(view[: 1 << 20])

    endpoint, access, secret, bucket, prefix, tag, payload, chunk = sys.argv[1:9]
    settings = S3Settings(bucket=bucket, prefix=prefix, endpoint=endpoint,
        access_key_id=access, secret_access_key=secret,
        multipart_chunk_bytes=int(chunk), multipart_concurrency=1)
    key = BlobKey.from_values({n: f"{n}-{tag}" for n in COMPONENT_NAMES})
    remote = Remote(S3Backend(settings))
    body = io.BufferedReader(PacedBody(payload), 1 << 20)
    print("start", flush=True)
    print(remote.publish(key, body, 1.0, {}).outcome.value, flush=True)
    """
)


@pytest.fixture(scope="module")
def big_payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_payload(tmp_path_factory.mktemp("big") / "payload", 160 << 20)


def _uploader(
    server: SeaweedServer, prefix: str, tag: str, payload: Path, chunk: int
) -> subprocess.Popen[str]:
    s = settings_for(server, prefix)
    args = [server.endpoint, s.access_key_id, s.secret_access_key, BUCKET, prefix, tag]
    return subprocess.Popen(
        [sys.executable, "-c", _UPLOADER, *map(str, args), str(payload), str(chunk)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _killed(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    assert child.stdout is not None
    assert child.stdout.read() == "", "the upload finished before the kill"
    child.stdout.close()


def _nothing_visible(server: SeaweedServer, prefix: str, tag: str, tmp_path: Path) -> None:
    reader = remote_for(server, prefix)
    key = make_key(tag)
    assert not reader.contains(key)
    assert reader.fetch(key, tmp_path / "got") is None
    assert list(reader.hexes()) == []


def test_an_uploader_killed_during_a_single_put_leaves_nothing(
    seaweed: SeaweedServer, big_payload: Path, tmp_path: Path
) -> None:
    prefix = new_prefix()
    child = _uploader(seaweed, prefix, "single", big_payload, 256 << 20)  # one PUT
    assert child.stdout is not None and child.stdout.readline().strip() == "start"
    assert child.stdout.readline().strip() == "body"  # hashed; the PUT's body is streaming
    time.sleep(0.3)  # a few paced MiB of the 160 are sent
    _killed(child)
    _nothing_visible(seaweed, prefix, "single", tmp_path)


def test_an_uploader_killed_during_a_multipart_upload_leaves_nothing_readable(
    seaweed: SeaweedServer, big_payload: Path, tmp_path: Path
) -> None:
    prefix = new_prefix()
    child = _uploader(seaweed, prefix, "multi", big_payload, 5 << 20)
    assert child.stdout is not None and child.stdout.readline().strip() == "start"
    assert child.stdout.readline().strip() == "body"
    deadline = time.monotonic() + 30
    while not seaweed.unfinished_uploads(BUCKET, f"{prefix}/") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seaweed.unfinished_uploads(BUCKET, f"{prefix}/"), "no multipart upload began"
    time.sleep(0.3)  # let a few parts land
    _killed(child)
    _nothing_visible(seaweed, prefix, "multi", tmp_path)
    # The parts stay stored (invisible) until aborted: a bucket lifecycle rule's job.
    assert seaweed.unfinished_uploads(BUCKET, f"{prefix}/")
