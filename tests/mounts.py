"""Real filesystem faults for store tests: a small tmpfs (disk full) and a read-only bind
mount. Both need root and a kernel that lets this process mount; tests that use them
skip (saying why) where it cannot."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` (created if missing)."""
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size_bytes},mode=0700"
    done = _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        _run("umount", "-l", str(where))


@contextlib.contextmanager
def read_only_view(source: Path, where: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``where``: writes fail with EROFS."""
    if not can_mount():
        pytest.skip("a read-only bind mount needs root and mount(8)")
    where.mkdir(parents=True, exist_ok=True)
    done = _run("mount", "--bind", str(source), str(where))
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        done = _run("mount", "-o", "remount,ro,bind", str(where))
        if done.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
        yield where
    finally:
        _run("umount", "-l", str(where))
