"""Issue 10, items 4 and 5: the digest memo sees an in-place edit whose timestamps
were put back (it keys on ctime), and a damaged memo only costs a hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ovspec.store.digests import DigestMemo, digest_file


def edit_in_place_keeping_times(path: Path) -> None:
    """Change one byte, same size, then restore atime and mtime (``touch -r`` style)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


@pytest.mark.parametrize("fresh", [False, True], ids=["same-process", "next-process"])
def test_an_edit_with_restored_timestamps_changes_the_digest(tmp_path: Path, fresh: bool) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(os.urandom(1 << 16))
    memo = DigestMemo(tmp_path / "digests")
    before = memo.digest(weights)
    edit_in_place_keeping_times(weights)
    again = DigestMemo(tmp_path / "digests") if fresh else memo
    after = again.digest(weights)
    assert after != before
    assert after == digest_file(weights)


def test_an_unchanged_file_is_hashed_once_across_processes(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(os.urandom(1 << 16))
    first = DigestMemo(tmp_path / "digests")
    value = first.digest(weights)
    second = DigestMemo(tmp_path / "digests")
    assert second.digest(weights) == value and second.hashed_files == 0


@pytest.mark.parametrize("damage", ["garbage", "zero", "folder", "link", "wrong-digest-format"])
def test_a_damaged_memo_falls_back_to_hashing(tmp_path: Path, damage: str) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(os.urandom(1 << 16))
    folder = tmp_path / "digests"
    DigestMemo(folder).digest(weights)
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    for path in files:
        if damage == "garbage":
            path.write_bytes(os.urandom(200))
        elif damage == "zero":
            path.write_bytes(b"")
        elif damage == "folder":
            path.unlink()
            path.mkdir()
        elif damage == "link":
            path.unlink()
            path.symlink_to(tmp_path / "nowhere")
        else:
            path.write_text(path.read_text().replace('"digest": "', '"digest": "zz'))
    memo = DigestMemo(folder)
    assert memo.digest(weights) == digest_file(weights)
    assert memo.hashed_files == 1


def test_an_unwritable_memo_folder_is_not_an_error(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"w" * 1000)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the memo folder should be")
    assert DigestMemo(blocker / "digests").digest(weights) == digest_file(weights)
