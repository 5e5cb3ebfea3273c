"""The remote tier against a broken disk and a hostile bucket (issue 29), through real
``ovspec`` processes and a real S3 server (SeaweedFS): a full filesystem and a file
size limit under a fetch, a manifest naming a payload larger than the disk, credentials
in an endpoint URL, and what a manifest tells every reader about its uploader."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import obstore
import pytest
from mounts import tmpfs
from s3server import BUCKET, new_prefix, remote_for, write_payload
from test_cli_remote import LADDER, aws_env

from ovspec.store.keys import BlobKey
from ovspec.store.local import Store
from ovspec.store.manifest import Manifest, describe_payload
from ovspec.store.records import BlobRecord
from ovspec.store.s3 import S3Backend
from ovspec.testing.disk import fill_disk
from ovspec.testing.seaweed import SeaweedServer

TRACEBACK = "Traceback (most recent call last)"
LABELS = ("decode@32", "decode@64")
CLI = (sys.executable, "-c", "from ovspec.cli import main; main()")


def ovspec(
    env: dict[str, str], *args: str, file_size_limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        assert file_size_limit is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        preexec_fn=limit if file_size_limit is not None else None,
        timeout=300,
        check=False,
    )


def one_line_or_none(done: subprocess.CompletedProcess[str]) -> None:
    assert TRACEBACK not in done.stderr, done.stderr
    assert len([x for x in done.stderr.splitlines() if x.startswith("ovspec: error:")]) <= 1


@pytest.fixture
def published(seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path) -> dict[str, str]:
    """A remote holding the tiny model's ladder, built by "another machine"."""
    env = {**aws_env(seaweed.endpoint), "OVSPEC_REMOTE": f"s3://{BUCKET}/{new_prefix()}"}
    done = ovspec(env, "build", str(tiny_dir), *LADDER, "--cache-dir", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    return env


def generate_args(tiny_dir: Path, root: Path) -> list[str]:
    return [
        "generate", str(tiny_dir), "--ids", "1,2,3", "--max-new-tokens", "40", *LADDER,
        "--ignore-eos", "--load-mode", "import", "--json", "--cache-dir", str(root),
    ]  # fmt: skip


def clean_tokens(env: dict[str, str], tiny_dir: Path, root: Path) -> list[int]:
    done = ovspec(env, *generate_args(tiny_dir, root))
    assert done.returncode == 0, done.stderr
    tokens: list[int] = json.loads(done.stdout)["token_ids"]
    return tokens


# -- item 1: a fetch onto a full disk fails open ----------------------------------------


def test_a_fetch_onto_a_full_disk_fails_open(
    published: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    expected = clean_tokens(published, tiny_dir, tmp_path / "clean")
    with tmpfs(tmp_path / "small", 1 << 20) as small:
        roots = [small / name for name in ("gen", "build", "pull")]
        for root in roots:
            Store(root).close()  # made while there is room, as a user's store would be
        fill_disk(small, leave_bytes=100 << 10)  # less than one tiny blob (~165 KB)
        gen = ovspec(published, *generate_args(tiny_dir, roots[0]))
        one_line_or_none(gen)
        assert gen.returncode == 0, gen.stderr
        assert json.loads(gen.stdout)["token_ids"] == expected
        assert "not downloading it" in gen.stderr
        build = ovspec(
            published, "build", str(tiny_dir), *LADDER, "--json", "--cache-dir", str(roots[1])
        )
        one_line_or_none(build)
        assert build.returncode == 0 and len(json.loads(build.stdout)["entries"]) == 4
        pull = ovspec(
            published, "cache", "pull", str(tiny_dir), *LADDER, "--json",
            "--cache-dir", str(roots[2]),
        )  # fmt: skip
        one_line_or_none(pull)
        report = json.loads(pull.stdout)  # --json prints its document
        assert pull.returncode == 1 and not report["ok"]
        assert report["counts"] == {"no_room": 4}
        for root in roots:
            assert list((root / "tmp").iterdir()) == []  # nothing half-written left
            assert list((root / "blobs").glob("*/*.blob")) == []  # nothing short stored
            assert Store(root).check() == []


def test_a_fetch_past_the_file_size_limit_is_one_line(
    published: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    # The disk has room, but each write past 100 KiB fails (EFBIG) mid-download.
    root = tmp_path / "store"
    Store(root).close()
    done = ovspec(
        published,
        "build",
        str(tiny_dir),
        *LADDER,
        "--cache-dir",
        str(root),
        file_size_limit=100 << 10,
    )
    one_line_or_none(done)
    assert done.returncode == 2 and "File too large" in done.stderr
    assert list((root / "tmp").iterdir()) == []
    assert Store(root).check() == []


# -- item 2: a payload larger than the disk is never streamed ---------------------------


def _point_at(remote_env: dict[str, str], seaweed: SeaweedServer, label: str, payload: Path,
              tiny_dir: Path, tmp_path: Path) -> str:  # fmt: skip
    """Rewrite the (unsigned) manifest of ``label`` to name ``payload``, uploaded under
    its sha256; the key's hex."""
    keys = ovspec(
        remote_env, "build", str(tiny_dir), *LADDER, "--json",
        "--cache-dir", str(tmp_path / "keys"),
    )  # fmt: skip
    hex_ = {e["specialization"]: e["key"] for e in json.loads(keys.stdout)["entries"]}[label]
    prefix = remote_env["OVSPEC_REMOTE"].split("/", 3)[3]
    backend = remote_for(seaweed, prefix).backend
    assert isinstance(backend, S3Backend)
    raw = backend._data
    with payload.open("rb") as f:
        ref = describe_payload(f)
    obstore.put(raw, S3Backend.payload_path(ref.sha256), payload.read_bytes())
    name = S3Backend.manifest_path(hex_)
    manifest = json.loads(bytes(obstore.get(raw, name).bytes()))
    manifest["payload"] = ref.to_json()
    obstore.put(raw, name, json.dumps(manifest).encode())
    return str(hex_)


def test_a_payload_larger_than_the_disk_is_not_downloaded(
    published: dict[str, str], seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path
) -> None:
    huge = write_payload(tmp_path / "huge", 24 << 20)
    _point_at(published, seaweed, "decode@32", huge, tiny_dir, tmp_path)
    expected = clean_tokens({}, tiny_dir, tmp_path / "clean")
    with tmpfs(tmp_path / "small", 8 << 20) as small:
        gen = ovspec(published, *generate_args(tiny_dir, small / "gen"))
        one_line_or_none(gen)
        assert gen.returncode == 0 and json.loads(gen.stdout)["token_ids"] == expected
        assert "not downloading it" in gen.stderr
        pull = ovspec(
            published, "cache", "pull", str(tiny_dir), *LADDER, "--json",
            "--cache-dir", str(small / "pull"),
        )  # fmt: skip
        one_line_or_none(pull)
        counts = json.loads(pull.stdout)["counts"]
        assert counts == {"no_room": 1, "pulled": 3}
        for root in (small / "gen", small / "pull"):
            assert list((root / "tmp").iterdir()) == []
            assert Store(root).check() == []
    # With room enough, the local size limit bounds it.
    root = tmp_path / "limited"
    Store(root, size_limit_bytes=4 << 20).close()
    gen = ovspec(published, *generate_args(tiny_dir, root))
    one_line_or_none(gen)
    assert gen.returncode == 0 and json.loads(gen.stdout)["token_ids"] == expected
    assert f"over the {4 << 20} allowed" in gen.stderr
    assert list((root / "tmp").iterdir()) == []


# -- item 12: credentials in a URL are never shown --------------------------------------


def test_credentials_in_an_endpoint_or_remote_url_are_never_shown(
    seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path
) -> None:
    secret = "hunter2-not-for-logs"
    closed = f"http://alice:{secret}@127.0.0.1:9"  # nothing listens on port 9
    env = {**aws_env(closed), "OVSPEC_REMOTE": f"s3://{BUCKET}/{new_prefix()}"}
    root = str(tmp_path / "s")
    runs = [
        ovspec(env, "build", str(tiny_dir), "--ladder", "32", "--cache-dir", root),
        ovspec(env, "cache", "pull", str(tiny_dir), "--ladder", "32", "--json",
               "--cache-dir", root),
        ovspec(env, "cache", "push", str(tiny_dir), "--ladder", "32", "--json",
               "--cache-dir", root),
        ovspec(env, "cache", "stats", "--cache-dir", root),
        ovspec({**aws_env(seaweed.endpoint), "OVSPEC_REMOTE": f"s3://bob:{secret}@{BUCKET}/p"},
               "build", str(tiny_dir), "--ladder", "32", "--cache-dir", root),
    ]  # fmt: skip
    assert "127.0.0.1:9" in runs[0].stderr  # the failure is reported, its endpoint shown
    for done in runs:
        one_line_or_none(done)
        assert secret not in done.stdout + done.stderr
    assert runs[-1].returncode == 2 and "carries credentials" in runs[-1].stderr


# -- item 16: a manifest tells readers nothing of the uploader's folders ----------------


def test_manifests_carry_no_local_path(
    published: dict[str, str], seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path
) -> None:
    prefix = published["OVSPEC_REMOTE"].split("/", 3)[3]
    remote = remote_for(seaweed, prefix)
    hexes = list(remote.hexes())
    assert len(hexes) == 4
    for hex_ in hexes:
        data = remote.backend.read_manifest(hex_)
        assert data is not None
        text = data.decode()
        assert str(tiny_dir) not in text and str(tmp_path) not in text
        assert json.loads(text)["metadata"]["model"] == tiny_dir.name
    # A builtin model lives in the store's models/ folder: its path names the uploader's
    # cache folder; only the folder's name leaves the machine.
    env = {**published, "OVSPEC_REMOTE": f"s3://{BUCKET}/{new_prefix()}"}
    root = tmp_path / "home-of-alice"
    done = ovspec(env, "build", "builtin:tiny", "--ladder", "32", "--cache-dir", str(root))
    assert done.returncode == 0, done.stderr
    remote = remote_for(seaweed, env["OVSPEC_REMOTE"].split("/", 3)[3])
    for hex_ in remote.hexes():
        data = remote.backend.read_manifest(hex_)
        assert data is not None and b"home-of-alice" not in data


# -- item 11: input validation comes from the model folder, not from a manifest ---------


def _rewrite_manifest(seaweed: SeaweedServer, remote_env: dict[str, str], hex_: str,
                      change: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """Edit one (unsigned) manifest in the bucket, as anyone with write access can."""
    backend = remote_for(seaweed, remote_env["OVSPEC_REMOTE"].split("/", 3)[3]).backend
    assert isinstance(backend, S3Backend)
    name = S3Backend.manifest_path(hex_)
    manifest = json.loads(bytes(obstore.get(backend._data, name).bytes()))
    change(manifest)
    obstore.put(backend._data, name, json.dumps(manifest).encode())


def _keys(env: dict[str, str], tiny_dir: Path, root: Path) -> dict[str, str]:
    done = ovspec(env, "build", str(tiny_dir), *LADDER, "--json", "--cache-dir", str(root))
    assert done.returncode == 0, done.stderr
    return {e["specialization"]: e["key"] for e in json.loads(done.stdout)["entries"]}


def test_a_manifest_cannot_widen_the_vocabulary(
    published: dict[str, str], seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path
) -> None:
    keys = _keys(published, tiny_dir, tmp_path / "a")

    def widen(manifest: dict[str, Any]) -> None:
        roles = json.loads(manifest["metadata"]["roles"])
        roles["vocab_tokens"] = 10**9
        manifest["metadata"]["roles"] = json.dumps(roles, sort_keys=True)

    for hex_ in keys.values():
        _rewrite_manifest(seaweed, published, hex_, widen)
    oov = ["--ids", "1,2,5000"]  # the tiny model's vocabulary is 2048

    def generate(root: Path, *ids: str) -> subprocess.CompletedProcess[str]:
        args = generate_args(tiny_dir, root)
        at = args.index("--ids")
        return ovspec(published, *args[:at], *ids, *args[at + 2 :])

    fresh = generate(tmp_path / "fresh", *oov)  # the roles from the remote's manifest
    one_line_or_none(fresh)
    assert fresh.returncode == 2 and "outside the model's vocabulary [0, 2048)" in fresh.stderr
    warm = tmp_path / "warm"
    assert generate(warm, "--ids", "1,2,3").returncode == 0  # fetched: roles now stored here
    again = generate(warm, *oov)
    one_line_or_none(again)
    assert again.returncode == 2 and "outside the model's vocabulary [0, 2048)" in again.stderr


# -- item 7: a graph is checked against the specialization it claims to be --------------


def test_a_manifest_pointing_at_another_specializations_payload_is_refused(
    published: dict[str, str], seaweed: SeaweedServer, tiny_dir: Path, tmp_path: Path
) -> None:
    keys = _keys(published, tiny_dir, tmp_path / "a")
    expected = clean_tokens({}, tiny_dir, tmp_path / "clean")
    backend = remote_for(seaweed, published["OVSPEC_REMOTE"].split("/", 3)[3]).backend
    m32, m64 = (Manifest.from_bytes(backend.read_manifest(keys[s]) or b"") for s in LABELS)

    def repoint(manifest: dict[str, Any]) -> None:
        manifest["payload"] = m64.payload.to_json()

    _rewrite_manifest(seaweed, published, keys["decode@32"], repoint)
    root = tmp_path / "b"
    for attempt in range(2):  # the forged manifest stays: every run refuses it again
        gen = ovspec(published, *generate_args(tiny_dir, root))
        one_line_or_none(gen)
        assert gen.returncode == 0, gen.stderr
        assert json.loads(gen.stdout)["token_ids"] == expected
        if attempt == 0:
            assert "does not serve decode@32" in gen.stderr
    entry = Store(root).local.record(BlobKey(m32.components))
    assert entry is not None and entry.checksum != m64.payload.xxh3_128  # compiled here
    assert ovspec({}, "cache", "check", "--cache-dir", str(root)).returncode == 0
    pulled = tmp_path / "pulled"
    pull = ovspec(
        published, "cache", "pull", str(tiny_dir), *LADDER, "--json", "--cache-dir", str(pulled)
    )
    one_line_or_none(pull)
    assert json.loads(pull.stdout)["counts"] == {"refused": 1, "pulled": 3}
    assert Store(pulled).local.record(BlobKey(m32.components)) is None  # never committed


def test_a_committed_entry_of_another_specialization_heals(tiny_dir: Path, tmp_path: Path) -> None:
    # What an older ovspec committed from a forged manifest: decode@64's payload stored
    # under decode@32's key, with a checksum that matches (so it verifies).
    root = tmp_path / "store"
    expected = clean_tokens({}, tiny_dir, root)
    store = Store(root)
    by_label = {e.metadata["specialization"]: e for e in store.entries()}
    e32, e64 = (by_label[label] for label in LABELS)
    key32 = BlobKey(e32.components)
    assert store.remove(e32.hex)
    poisoned = BlobRecord(
        hex=e32.hex,
        components=e32.components,
        size_bytes=e64.size_bytes,
        checksum=e64.checksum,
        compile_s=e32.compile_s,
        metadata=dict(e32.metadata),
    )
    assert store.local.put(key32, e64.path, poisoned).stored
    store.close()
    for attempt in range(2):
        gen = ovspec({}, *generate_args(tiny_dir, root))
        one_line_or_none(gen)
        assert gen.returncode == 0, gen.stderr
        assert json.loads(gen.stdout)["token_ids"] == expected
        if attempt == 0:
            assert "does not serve decode@32" in gen.stderr and "quarantined" in gen.stderr
    healed = Store(root).local.record(key32)
    assert healed is not None and healed.checksum != e64.checksum
    assert ovspec({}, "cache", "check", "--cache-dir", str(root)).returncode == 0
