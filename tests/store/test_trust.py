"""Issue 10, items 2 and 3: nothing outside the root is touched, nothing another user
wrote is run, and a store another user owns or can write is refused unless trusted
(then read-only). Faults come from outside the store's code: links, chown, chmod, a
read-only mount and a planted pickle."""

from __future__ import annotations

import errno
import os
import pickle
import sqlite3
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from mounts import read_only_view
from test_local import make_key, never, payload, put, writer

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.errors import StoreError
from ovspec.store.local import Store, StoreWarning

OTHER_UID = 65534  # nobody


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file below ``folder``: (mode, mtime_ns, bytes); links not followed."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for path in [folder, *sorted(folder.rglob("*"))]:
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        out[str(path.relative_to(folder))] = (st.st_mode, st.st_mtime_ns, data)
    return out


# -- item 3: no pickles, and a store another user can write is refused ------------------


class Planted:
    """What an attacker pickles: unpickling it creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(str(self.marker)), "ran"))  # type: ignore[return-value]


def plant_pickles(index_folder: Path, hex_: str, marker: Path) -> int:
    """Write a pickle wherever the index keeps rows, as a user who can write it would:
    a diskcache row (format 1's index: mode 4 = pickled value) and a row of every table
    that has a text column. Returns how many rows were planted."""
    bomb = pickle.dumps(Planted(marker))
    planted = 0
    for db_path in sorted(p for p in index_folder.iterdir() if p.is_file()):
        try:
            db = sqlite3.connect(db_path, isolation_level=None)
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        except sqlite3.DatabaseError:
            continue
        for table in tables:
            cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            if {"key", "raw", "mode", "value"} <= set(cols):  # diskcache
                db.execute(f"UPDATE {table} SET mode = 4, value = ?, filename = NULL", (bomb,))
                planted += db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            elif "record" in cols:
                planted += db.execute(f"UPDATE {table} SET record = ?", (bomb,)).rowcount
        db.close()
    return planted


def test_a_pickle_planted_in_the_index_never_runs(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        put(store, "victim", payload(3000))
        put(store, "other", payload(3000))
    marker = tmp_path / "pwned"
    assert plant_pickles(root / "index", make_key("victim").hex, marker) >= 2
    runner = CliRunner()
    for argv in (["ls"], ["stats"], ["check"], ["check", "--fix"], ["gc"], ["ls", "--json"]):
        result = runner.invoke(cli, ["cache", *argv, "--cache-dir", str(root)])
        assert "Traceback" not in result.output, result.output
    with Store(root, strict=False) as store:
        store.get_or_create(make_key("victim"), writer(payload(100)))
    assert not marker.exists(), "a pickled value planted in the index was unpickled"
    with Store(root, strict=True) as store:
        assert store.check() == []


def test_the_index_is_plain_sqlite_with_a_fixed_schema(store: Store) -> None:
    put(store, "plain")
    files = sorted(p.name for p in (store.root / "index").iterdir())
    assert files == ["index.sqlite3"]
    db = sqlite3.connect(store.root / "index" / "index.sqlite3")
    kinds = {(r[0], r[1]) for r in db.execute("SELECT type, name FROM sqlite_master")}
    assert {name for kind, name in kinds if kind == "table"} == {"entries", "counters", "settings"}
    assert not any(kind in ("trigger", "view") for kind, _ in kinds)
    (record,) = db.execute("SELECT record FROM entries").fetchone()
    assert isinstance(record, str) and record.startswith("{")  # JSON text, not a pickle
    db.close()


@pytest.mark.parametrize("where", ["root", "blobs", "index", "tmp"])
def test_a_store_another_user_owns_is_refused_unless_trusted(tmp_path: Path, where: str) -> None:
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        put(store, "shared", b"s" * 2000)
    target = root if where == "root" else root / where
    os.chown(target, OTHER_UID, -1)
    with pytest.raises(StoreError, match=r"not safe to use: .*owned by .*trust_shared=True"):
        Store(root)
    result = CliRunner().invoke(cli, ["cache", "ls", "--cache-dir", str(root)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and "--trust-shared-store" in result.stderr
    result = CliRunner().invoke(
        cli, ["cache", "ls", "--json", "--trust-shared-store", "--cache-dir", str(root)]
    )
    assert result.exit_code == 0, result.output
    assert "OVSPEC_TRUST_SHARED_STORE" not in os.environ  # the flag is scoped to its command


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_store_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "store"
    Store(root).close()
    (root / "blobs").chmod(mode)
    os.chown(root / "blobs", os.geteuid(), 0 if os.getegid() != 0 else 4)  # a shared group
    with pytest.raises(StoreError, match="writable by"):
        Store(root)


def test_a_trusted_shared_store_is_used_read_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    data = payload(5000)
    with Store(root, strict=True) as store:
        put(store, "hit", data)
    for path in [root, *root.rglob("*")]:
        os.chown(path, OTHER_UID, -1, follow_symlinks=False)
    before = snapshot(root)
    with Store(root, trust_shared=True) as shared:
        assert shared.read_only
        hit = shared.get_or_create(make_key("hit"), never, map_payload=True)
        assert hit.hit and hit.payload is not None and bytes(hit.payload) == data
        with pytest.warns(StoreWarning, match="read-only"):
            miss = shared.get_or_create(make_key("miss"), writer(b"m" * 10))
        assert not miss.stored and miss.path.read_bytes() == b"m" * 10
        miss.discard()
        assert shared.check() == []
        with pytest.raises(StoreError, match="read-only"):
            shared.clear()
    assert snapshot(root) == before  # nothing written: no counters, no access times


def test_blobs_of_a_trusted_shared_store_are_still_verified(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        path = put(store, "bad", payload(4000))
    path.write_bytes(b"\0" * 4000)  # the owner's disk, or the owner, flipped it
    os.chown(root, OTHER_UID, -1)
    with Store(root, trust_shared=True) as shared, pytest.warns(StoreWarning, match="corrupt"):
        assert shared.lookup(make_key("bad")) is None


def test_a_read_only_mount_serves_reads(tmp_path: Path) -> None:
    root = tmp_path / "store"
    data = payload(6000)
    with Store(root, strict=True) as store:
        put(store, "ro", data)
    with read_only_view(root, tmp_path / "view") as view:
        with Store(view) as store:
            assert store.read_only
            outcome = store.get_or_create(make_key("ro"), never, map_payload=True)
            assert outcome.hit and bytes(outcome.payload or b"") == data
            with pytest.warns(StoreWarning, match="read-only"):
                other = store.get_or_create(make_key("new"), writer(b"n" * 10))
            assert not other.stored
            other.discard()
        runner = CliRunner()
        listed = runner.invoke(cli, ["cache", "ls", "--json", "--cache-dir", str(view)])
        assert listed.exit_code == 0, listed.output
        fixed = runner.invoke(cli, ["cache", "check", "--fix", "--cache-dir", str(view)])
        assert fixed.exit_code == 2 and "read-only" in fixed.stderr
        assert "Traceback" not in fixed.output


def test_a_folder_this_user_cannot_write_opens_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root ignores permissions, so "a folder I may read but not write" cannot be made
    # with chmod here: the writability probe is made to fail with EACCES instead.
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        put(store, "perm", b"p" * 100)

    def denied(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with Store(root) as store:
        assert store.read_only
        assert store.get_or_create(make_key("perm"), never).hit


# -- item 2: links inside the store are reported, never followed -----------------------

LEVELS = ["quarantine", "tmp", "locks", "blobs", "blobs/xx", "index"]


def outside_canaries(folder: Path, hex_: str) -> None:
    """Files named like the store's own, so a store that followed a link would act."""
    folder.mkdir()
    for name in (
        "canary.txt",
        f"{hex_}.blob",
        f"{hex_}.json",
        f"{hex_}.lock",
        f"{hex_}.1.ab.blob.part",
        "index.sqlite3",
        "stale.tmp",
    ):
        (folder / name).write_bytes(b"precious " + name.encode())
        os.utime(folder / name, (1, 1))  # old: every age-based rule would pick it
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.txt").write_text("precious")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("command", ["clear", "gc", "check --fix", "check"])
def test_a_link_at_any_folder_level_is_never_followed(
    tmp_path: Path, level: str, command: str
) -> None:
    root = tmp_path / "store"
    hex_ = make_key("kept").hex
    with Store(root, strict=True) as store:
        put(store, "kept", payload(2000))
    outside = tmp_path / "outside"
    outside_canaries(outside, hex_)
    # The entry's own fan-out folder, so the index still points through the link.
    link = root / "blobs" / hex_[:2] if level == "blobs/xx" else root / level
    link.rename(tmp_path / f"was-{level.replace('/', '-')}")
    link.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)

    argv = ["cache", *command.split(), "--cache-dir", str(root)]
    if command == "clear":
        argv.append("--yes")
    result = CliRunner().invoke(cli, argv)
    assert snapshot(outside) == before, f"`cache {command}` touched files through {level}"
    assert "Traceback" not in result.output, result.output
    if command == "check":
        assert result.exit_code == 1 and "symbolic link" in result.output
        with pytest.raises(StoreError, match=r"symbolic link.*never follows links"):
            Store(root)  # what build and generate meet: one line, until check --fix
    else:
        assert result.exit_code in (0, 1), result.output
        assert not link.is_symlink()
        with Store(root, strict=True) as store:
            assert store.check() == []


def test_a_linked_payload_or_sidecar_is_never_read(store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 3000)
    path = put(store, "link", payload(3000))
    path.unlink()
    path.symlink_to(secret)  # same size, so only reading it could tell
    with pytest.warns(StoreWarning, match="corrupt"):
        assert store.lookup(make_key("link")) is None
    assert secret.read_bytes() == b"s" * 3000
    store.check(fix=True)
    assert secret.exists()


def test_a_format_1_store_is_migrated_without_reading_its_index(tmp_path: Path) -> None:
    """Format 1 kept a diskcache index (pickles). Its blobs and sidecars are what format
    2 keeps, so the index is deleted unread and rebuilt from the sidecars."""
    root = tmp_path / "store"
    data = {seed: payload(1500) for seed in ("m1", "m2")}
    with Store(root, strict=True) as store:
        for seed, d in data.items():
            put(store, seed, d)
    (root / "FORMAT").write_text("ovspec-store 1\n")
    for path in (root / "index").iterdir():
        path.unlink()
    marker = tmp_path / "pwned"
    db = sqlite3.connect(root / "index" / "cache.db", isolation_level=None)
    db.execute("CREATE TABLE Cache (key BLOB, raw INTEGER, mode INTEGER, value BLOB)")
    db.execute("INSERT INTO Cache VALUES ('x', 1, 4, ?)", (pickle.dumps(Planted(marker)),))
    db.close()
    (root / "digests").mkdir(exist_ok=True)
    (root / "digests" / "cache.db").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.warns(StoreWarning, match="migrated store .* from format 1 to 2"):
        store = Store(root, strict=True)
    with store:
        for seed, d in data.items():
            assert store.get_or_create(make_key(seed), never).path.read_bytes() == d
        assert store.check() == []
    assert not marker.exists()
    assert (root / "FORMAT").read_text().strip() == "ovspec-store 2"
    assert sorted(p.name for p in (root / "index").iterdir()) == ["index.sqlite3"]
