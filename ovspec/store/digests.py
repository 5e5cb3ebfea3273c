"""File digests for blob keys, memoized so a 1 GB weights file is hashed once.

The memo is keyed on (resolved path, size, mtime_ns, inode): a rewrite of the file
changes at least one of them. It lives in memory and, when given a folder, in a
small diskcache so later processes skip the hash too.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import diskcache
import xxhash

_CHUNK_BYTES = 8 << 20


def size_and_digest(path: Path) -> tuple[int, str]:
    """(bytes, xxh3-128 hex) of a file, streamed through one reused buffer.

    The buffer is no larger than the file: a fresh 8 MiB buffer per call costs
    thousands of page faults, more than hashing a small blob.
    """
    h = xxhash.xxh3_128()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(min(_CHUNK_BYTES, max(os.fstat(f.fileno()).st_size, 1)))
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def digest_file(path: Path) -> str:
    """xxh3-128 of a file's bytes, streamed."""
    return size_and_digest(path)[1]


class DigestMemo:
    """Remembers file digests by identity (path, size, mtime, inode)."""

    def __init__(self, folder: Path | None = None) -> None:
        self._memory: dict[tuple[str, int, int, int], str] = {}
        self._lock = threading.Lock()
        self._disk: diskcache.Cache | None = None
        if folder is not None:
            try:
                self._disk = diskcache.Cache(str(folder))
            except OSError:
                # A memo is an optimization: without it we hash again, nothing breaks.
                self._disk = None
        self.hashed_files = 0  # how many times a file was actually read (tests check this)

    def digest(self, path: Path) -> str:
        resolved = path.resolve()
        st = os.stat(resolved)
        identity = (str(resolved), st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            if identity in self._memory:
                return self._memory[identity]
        stored = self._disk.get(identity) if self._disk is not None else None
        if isinstance(stored, str):
            value = stored
        else:
            value = digest_file(resolved)
            self.hashed_files += 1
            if self._disk is not None:
                with contextlib.suppress(OSError):  # see __init__: the memo may fail open
                    self._disk.set(identity, value)
        with self._lock:
            self._memory[identity] = value
        return value

    def close(self) -> None:
        if self._disk is not None:
            self._disk.close()
