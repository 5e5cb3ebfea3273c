"""Per-key cross-process locks: an exclusive ``flock`` on ``locks/<hex>.lock``.

``fcntl.flock`` needs a local filesystem (it is unreliable over NFS, and so is
SQLite's WAL mode under the index). The kernel drops a flock when its holder dies, so
a killed producer never wedges a key. flock locks belong to an open file description,
so two threads of one process exclude each other as long as each opens the lock file
itself, which ``KeyLock`` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class KeyLock:
    """An exclusive ``flock`` on one lock file; one fd per acquisition.

    gc() may unlink an idle lock file while holding it, so after locking we check
    that the path still names the inode we locked, and retry otherwise (the
    classic flock-and-unlink race).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self, *, blocking: bool) -> bool:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        while True:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, flags)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.stat(self._path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last fd of the description drops the flock
            self._fd = None


@contextlib.contextmanager
def try_lock(path: Path, *, held: bool = False) -> Iterator[bool]:
    """Yield whether this caller may change the key's files (non-blocking).

    ``held``: the caller already holds the key's lock (yields True, locks nothing).
    """
    if held:
        yield True
        return
    lock = KeyLock(path)
    got = lock.acquire(blocking=False)
    try:
        yield got
    finally:
        lock.release()
