"""Issue 10, items 1, 4, 6 and 9 through the compiler: a blob whose export failed
half-way is never published (RLIMIT_FSIZE and a full tmpfs, real faults in real
processes), a stored blob that does not import heals, an eviction between checksum and
import is harmless, changed weights never get an old blob, and fallback compiles leave
no temp folders behind."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from mounts import tmpfs

from ovspec.compile.compiler import Compiler
from ovspec.compile.modes import BlobMode
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import Specialization
from ovspec.store.digests import DigestMemo
from ovspec.store.keys import BlobKey
from ovspec.store.local import Store, StoreWarning
from ovspec.testing.disk import fill_disk

SPEC = Specialization.decode(32)
CLI = [sys.executable, "-c", "from ovspec.cli import main; main()"]


def ovspec(
    *args: str, file_size_limit: int | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
        env={**os.environ, **(env or {})},
        check=False,
    )


def generate_ids(model: Path, root: Path) -> list[int]:
    done = ovspec(
        "generate", str(model), "--ids", "5,6,7", "--max-new-tokens", "6", "--ladder", "32",
        "--json", "--cache-dir", str(root), "--load-mode", "import",  # through the store
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ids: list[int] = json.loads(done.stdout)["token_ids"]
    return ids


def entries(root: Path) -> list[dict[str, object]]:
    done = ovspec("cache", "ls", "--json", "--cache-dir", str(root))
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, object]] = json.loads(done.stdout)
    return listed


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ovspec: error:")]
    assert len(errors) == 1, done.stderr


def make(model: Path, store: Store, **kwargs: object) -> Compiler:
    """A plain graph (no rewrites): ``logits`` feeds the original decode inputs."""
    kwargs.setdefault("rewrites", RewriteSet())
    return Compiler(ModelDir.open(model), "CPU", EXACT_CPU_PROPERTIES, store, **kwargs)  # type: ignore[arg-type]


def logits(compiler: Compiler, feed_ids: Sequence[int] = (7,)) -> np.ndarray:
    program = compiler.load(SPEC)
    llm = compiler.llm()
    feed: dict[str, np.ndarray] = {
        "input_ids": np.array([list(feed_ids)]),
        "position_ids": np.array([[0]]),
        "attention_mask": np.array([[0] * 32 + [1]]),
    }
    for role in llm.roles.kv:
        feed[role.past_input] = np.zeros(role.shape(1, 32), dtype=np.float32)
    out: np.ndarray = program.compiled.create_infer_request().infer(feed)["logits"].copy()
    return out


# -- item 1: a failed export is never stored -------------------------------------------


def build(model: Path, root: Path, phase: str, **kwargs: int) -> subprocess.CompletedProcess[str]:
    return ovspec(
        "build", str(model), "--ladder", "32", "--phases", phase, "--cache-dir", str(root),
        **kwargs,
    )  # fmt: skip


def test_a_file_size_limit_during_export_stores_nothing(tiny_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    clean = generate_ids(tiny_dir, tmp_path / "clean")
    # A store in use (index, memo and one entry exist), then a build whose blob (~150 KB)
    # outgrows the file size limit; the store's own files stay under it.
    assert build(tiny_dir, root, "prefill").returncode == 0
    done = build(tiny_dir, root, "decode", file_size_limit=100_000)
    assert_one_line_error(done, 2)
    assert "File too large" in done.stderr
    assert len(entries(root)) == 1  # the prefill blob; no short decode blob
    check = ovspec("cache", "check", "--cache-dir", str(root))
    assert check.returncode == 0, check.stdout + check.stderr
    assert generate_ids(tiny_dir, root) == clean  # nothing poisoned: a later run is right


def test_a_full_disk_during_export_stores_nothing(tiny_dir: Path, tmp_path: Path) -> None:
    clean = generate_ids(tiny_dir, tmp_path / "clean")
    with tmpfs(tmp_path / "small", 1 << 20) as mounted:
        root = mounted / "store"
        assert build(tiny_dir, root, "prefill").returncode == 0
        fill_disk(mounted, leave_bytes=140_000)  # room for index writes, not for a blob
        done = build(tiny_dir, root, "decode")
        assert done.returncode == 0, done.stderr  # fails open: compiled outside, not stored
        assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
        assert len(entries(root)) == 1
        assert generate_ids(tiny_dir, root) == clean
        check = ovspec("cache", "check", "--cache-dir", str(root))
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_stored_blob_that_does_not_import_is_quarantined_and_rebuilt(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """What an older ovspec left after a short write: a truncated payload whose sidecar
    and row carry the truncated size and checksum, so it verifies."""
    reference = logits(make(tiny_dir, Store(tmp_path / "reference", strict=True)))
    store = Store(tmp_path / "store", strict=True)
    compiler = make(tiny_dir, store)
    built = compiler.build(SPEC)
    entry = store.find(built.key_hex)
    half = tmp_path / "half.blob"
    half.write_bytes(entry.path.read_bytes()[: entry.size_bytes // 2])
    from ovspec.store.digests import digest_file

    poisoned = dataclasses.replace(
        entry, size_bytes=half.stat().st_size, checksum=digest_file(half)
    )
    assert store.remove(entry.hex)
    assert store.local.put(BlobKey(entry.components), half, poisoned).stored
    assert store.check() == []  # the poison verifies: only an import can tell

    again = make(tiny_dir, store)
    with pytest.warns(StoreWarning, match="cannot import"):
        healed = logits(again)
    np.testing.assert_array_equal(healed, reference)
    assert store.check() == [] and store.stats().quarantined == 1
    assert make(tiny_dir, store).build(SPEC).hit  # the rebuilt blob is the stored one now
    store.close()


# -- item 6: eviction between checksum and import ----------------------------------------


def test_an_entry_cleared_between_checksum_and_import_is_harmless(
    tiny_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    store = Store(root, strict=True)
    reference = logits(make(tiny_dir, store))  # stored, and its logits
    other = Store(root, strict=True)  # another process's view of the same store
    real = store.get_or_create

    def then_cleared(*args: object, **kwargs: object) -> object:
        outcome = real(*args, **kwargs)  # type: ignore[arg-type]
        other.clear()  # after the checksum, before the import
        return outcome

    compiler = make(tiny_dir, store)
    store.get_or_create = then_cleared  # type: ignore[method-assign]
    np.testing.assert_array_equal(logits(compiler), reference)
    store.get_or_create = real  # type: ignore[method-assign]
    assert store.entries() == [] and store.check() == []
    other.close()
    store.close()


# -- item 4: changed weights never get an old (full) blob -----------------------------


def test_weights_edited_in_place_with_restored_times_get_a_new_key(
    tiny_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    store = Store(tmp_path / "store", strict=True)
    first = make(model, store, blob_mode=BlobMode.FULL).build(SPEC)
    weights = model / "openvino_model.bin"
    st = weights.stat()
    with open(weights, "r+b") as f:
        f.seek(st.st_size - 64)
        f.write(os.urandom(64))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # `touch -r`: times put back
    # A new process: a new compiler with a new in-memory memo over the same store.
    second = make(model, store, blob_mode=BlobMode.FULL, memo=DigestMemo(store.root / "digests"))
    rebuilt = second.build(SPEC)
    assert rebuilt.key_hex != first.key_hex and not rebuilt.hit
    store.close()


# -- item 9: fallback compiles leave nothing behind ------------------------------------


def test_fallback_compiles_leave_no_temp_folders(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(system_tmp))
    store = Store(tmp_path / "store")
    blobs = str(store.root / "blobs")
    real_replace = os.replace

    def full_disk(src: object, dst: object, **kwargs: object) -> None:
        if str(dst).startswith(blobs):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_disk)
    compiler = make(tiny_dir, store)
    with pytest.warns(StoreWarning):
        assert not compiler.build(SPEC).stored
        program = compiler.load(Specialization.decode(64))
    assert not program.build.stored
    monkeypatch.undo()
    assert list(system_tmp.iterdir()) == []
    store.close()
