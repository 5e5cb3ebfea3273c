"""Issue 10, items 5, 7 and 9: a damaged index is rebuilt from the sidecars, a full
disk under the index is one line or a warning, and the small leaks are gone. Damage is
done to the files from outside (truncate, garbage, a folder in place of a file, a
full tmpfs), never through the store's own code."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from mounts import tmpfs
from test_local import make_key, never, payload, put, writer

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.errors import StoreError
from ovspec.store.local import Store, StoreWarning
from ovspec.testing.disk import fill_disk

DAMAGES = ["truncate", "garbage", "zero", "folder"]


def damage_index(root: Path, how: str) -> None:
    """Damage every file of the index folder the way a disk or a user would."""
    for path in sorted(p for p in (root / "index").iterdir() if p.is_file()):
        size = path.stat().st_size
        if how == "truncate":
            with open(path, "r+b") as f:
                f.truncate(size // 2)
        elif how == "garbage":
            path.write_bytes(os.urandom(size))
        elif how == "zero":
            path.write_bytes(b"")
        else:
            path.unlink()
            path.mkdir()
            (path / "junk").write_text("x")


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_index_is_rebuilt_from_the_sidecars_on_open(tmp_path: Path, how: str) -> None:
    root = tmp_path / "store"
    data = {i: payload(2000 + i) for i in range(3)}
    with Store(root, strict=True) as store:
        for i, d in data.items():
            put(store, i, d)
    damage_index(root, how)
    with pytest.warns(StoreWarning, match="rebuilt it from 3 sidecars"):
        store = Store(root, strict=True)
    with store:
        assert {e.hex for e in store.entries()} == {make_key(i).hex for i in data}
        for i, d in data.items():
            hit = store.get_or_create(make_key(i), never)
            assert hit.hit and hit.path.read_bytes() == d
        assert store.check() == []
    result = CliRunner().invoke(cli, ["cache", "ls", "--json", "--cache-dir", str(root)])
    assert result.exit_code == 0 and len(json.loads(result.output)) == 3


def test_damage_past_the_first_page_is_found_and_rebuilt_by_check_fix(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        for i in range(2):
            put(store, i)
    # The header page stays good, so the file opens; SQLite's own check finds the rest.
    db = max((p for p in (root / "index").iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(db.read_bytes())
    assert len(data) > 2 * 4096
    data[4096 + 8 : 2 * 4096] = os.urandom(4096 - 8)
    db.write_bytes(bytes(data))
    result = CliRunner().invoke(cli, ["cache", "check", "--fix", "--cache-dir", str(root)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    with Store(root, strict=True) as store:
        assert len(store.entries()) == 2 and store.check() == []


def test_a_full_disk_under_the_index_fails_open_or_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "store"
    Store(root, strict=True).close()
    index_files = {p.name: p.read_bytes() for p in (root / "index").iterdir()}
    with tmpfs(root / "index", 64 * 1024) as mounted:
        for name, data in index_files.items():
            (mounted / name).write_bytes(data)
        fill_disk(mounted)
        lenient = Store(root)
        data = payload(3000)
        with pytest.warns(StoreWarning, match=r"cannot (store|write) .*(full|space)"):
            outcome = lenient.get_or_create(make_key("full"), writer(data))
        assert not outcome.stored and outcome.path.read_bytes() == data
        outcome.discard()
        lenient.close()
        strict = Store(root, strict=True)
        with pytest.raises(StoreError, match=r"cannot (store|write) .*(full|space)"):
            strict.get_or_create(make_key("full"), writer(data))
        strict.close()
        assert list((root / "blobs").glob("*/*")) == []  # the store is unchanged
        assert list((root / "tmp").iterdir()) == []
        (mounted / "filler").unlink()
        with Store(root, strict=True) as store:
            assert store.entries() == [] and store.check() == []


# -- item 9: small leaks -------------------------------------------------------------


def test_temps_of_killed_writers_are_removed_on_open(store: Store) -> None:
    hex_ = make_key("dead").hex
    stale = store.root / "tmp" / f"{hex_}.99999.abcd1234.blob.part"
    stale.write_bytes(b"half a blob")
    Store(store.root).close()
    assert not stale.exists()


def test_a_format_file_that_is_not_text_is_one_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "store"
    Store(root).close()
    (root / "FORMAT").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(StoreError, match="not an ovspec store"):
        Store(root)


def test_a_folder_where_a_sidecar_or_lock_belongs_is_repaired(store: Store) -> None:
    key = make_key("dirs")
    path = put(store, "dirs", payload(1000))
    sidecar = path.with_suffix(".json")
    sidecar.unlink()
    sidecar.mkdir()
    (sidecar / "x").write_text("x")
    lock = store.root / "locks" / f"{key.hex}.lock"
    lock.unlink()
    lock.mkdir()
    assert store.check() != []
    store.check(fix=True)
    assert store.check() == []
    assert json.loads(sidecar.read_text())["hex"] == key.hex
    assert store.get_or_create(key, never).hit


def test_clear_removes_a_quarantined_folder(store: Store) -> None:
    key = make_key("qdir")
    path = put(store, "qdir", payload(1000))
    path.unlink()
    path.mkdir()  # a folder where the payload belongs: corrupt, quarantined on lookup
    (path / "inner").write_text("x")
    with pytest.warns(StoreWarning, match="corrupt"):
        assert store.lookup(key) is None
    assert any((store.root / "quarantine").iterdir())
    store.clear()
    assert list((store.root / "quarantine").iterdir()) == []
    store.clear()  # and again: clear never fails for good


def test_fallback_compiles_leave_no_temp_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    monkeypatch.setattr("tempfile.tempdir", None)
    store = Store(tmp_path / "store")
    real_replace = os.replace
    blobs = str(store.root / "blobs")

    def replace(src: object, dst: object, **kwargs: object) -> None:
        if str(dst).startswith(blobs):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    for i in range(3):
        with pytest.warns(StoreWarning):
            outcome = store.get_or_create(make_key(f"out{i}"), writer(payload(100)))
        assert not outcome.stored
        outcome.discard()
    monkeypatch.undo()
    assert list(system_tmp.iterdir()) == []
    store.close()
