"""Issue 29, items 6 and 10: a FIFO where the store or the remote expects a regular file
(a payload, the signing key file) is damage, never read through: the open must not block
waiting for a writer. The FIFOs are real (``os.mkfifo``) and the commands real processes,
bounded by a timeout so a regression fails instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_local import make_key, payload, put

from ovspec.store.local import Store

CLI = (sys.executable, "-c", "from ovspec.cli import main; main()")
BOUND_S = 60.0


def ovspec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_check_reports_a_fifo_at_a_payload_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root, strict=True) as store:
        path = put(store, "victim", payload(3000))
        put(store, "other", payload(3000))
    path.unlink()
    os.mkfifo(path)
    done = ovspec("cache", "check", "--cache-dir", str(root))  # read-only: nothing moved
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    hex_ = make_key("victim").hex
    assert f"{hex_[:12]}: payload corrupt" in done.stdout + done.stderr
    fixed = ovspec("cache", "check", "--fix", "--cache-dir", str(root))
    assert fixed.returncode == 0 and "Traceback" not in fixed.stderr
    assert not path.exists()  # quarantined (a FIFO is moved, never opened)
    with Store(root, strict=True) as store:
        assert store.check() == []


def test_a_fifo_as_the_remote_key_file_is_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "keys"
    os.mkfifo(fifo, 0o600)
    root = tmp_path / "store"
    for how in (["--remote-key-file", str(fifo)], []):
        done = ovspec(
            "cache",
            "pull",
            "builtin:tiny",
            "--ladder",
            "32",
            "--cache-dir",
            str(root),
            "--remote",
            "s3://bucket/prefix",
            *how,
            env={} if how else {"OVSPEC_REMOTE_KEY_FILE": str(fifo)},
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "is not a regular file" in lines[0], done.stderr
