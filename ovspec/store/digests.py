"""File digests for blob keys, memoized by file identity (path, device, inode, size,
mtime, ctime) in memory and, given a folder, in one small JSON file per model file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import threading
from pathlib import Path

import xxhash

_CHUNK_BYTES = 8 << 20
_DIGEST_RE = re.compile(r"[0-9a-f]{32}")
MEMO_SUFFIX = ".json"
MEMO_RE = re.compile(r"[0-9a-f]{16}\.json")

Identity = tuple[str, int, int, int, int, int]


def size_and_digest(path: Path, *, follow_links: bool = True) -> tuple[int, str]:
    """(bytes, xxh3-128 hex) of a file, streamed through one reused buffer.

    The buffer is no larger than the file: a fresh 8 MiB buffer per call costs
    thousands of page faults, more than hashing a small blob. ``follow_links=False``:
    a link at ``path`` fails with ELOOP instead of being read (store payloads).
    Anything that is not a regular file fails with EISDIR before a byte is read:
    O_NONBLOCK, because opening a FIFO blocking waits forever for a writer (issue 29).
    """
    h = xxhash.xxh3_128()
    size = 0
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(21, "not a regular file", str(path))
        buf = bytearray(min(_CHUNK_BYTES, max(st.st_size, 1)))
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def digest_file(path: Path) -> str:
    """xxh3-128 of a file's bytes, streamed."""
    return size_and_digest(path)[1]


def identity_of(path: Path) -> Identity:
    st = os.stat(path)
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestMemo:
    """Remembers file digests by identity (path, device, inode, size, mtime, ctime).

    ctime matters: ``touch -d`` (or ``os.utime``) can put an edited file's mtime back,
    but nothing short of changing the clock restores its ctime, so an in-place weights
    edit always gets a new digest (and new keys). The memo is an optimization only: a
    memo file that is missing, unreadable, malformed or for another identity is ignored
    and the file hashed; one that cannot be written is not. Nothing read from it is
    trusted beyond "this identity had this digest", and the store passes no folder when
    another user may write it.
    """

    def __init__(self, folder: Path | None = None, *, read_only: bool = False) -> None:
        self._memory: dict[Identity, str] = {}
        self._lock = threading.Lock()
        self._folder = folder
        self._read_only = read_only
        self.hashed_files = 0  # how many times a file was actually read (tests check this)

    def digest(self, path: Path) -> str:
        resolved = path.resolve()
        identity = identity_of(resolved)
        with self._lock:
            if identity in self._memory:
                return self._memory[identity]
        value = self._load(identity)
        if value is None:
            value = digest_file(resolved)
            self.hashed_files += 1
            # A file rewritten while we read it: its digest names neither version.
            if identity_of(resolved) == identity:
                self._save(identity, value)
        with self._lock:
            self._memory[identity] = value
        return value

    def _memo_path(self, identity: Identity) -> Path | None:
        if self._folder is None:
            return None
        return self._folder / f"{xxhash.xxh3_64_hexdigest(identity[0].encode())}{MEMO_SUFFIX}"

    def _load(self, identity: Identity) -> str | None:
        path = self._memo_path(identity)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                record = json.loads(f.read(4096).decode("utf-8"))
        except (OSError, ValueError):
            return None  # absent, a link, a folder, not JSON: hash instead
        if not isinstance(record, dict):
            return None
        digest = record.get("digest")
        if record.get("identity") != list(identity) or not isinstance(digest, str):
            return None
        return digest if _DIGEST_RE.fullmatch(digest) else None

    def _save(self, identity: Identity, digest: str) -> None:
        path = self._memo_path(identity)
        if path is None or self._read_only:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path.parent, 0o700)
            data = json.dumps({"identity": list(identity), "digest": digest}).encode()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with open(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            # The memo is an optimization: not writing it costs a hash next time.
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def close(self) -> None:
        """Nothing to release (kept for callers that close what they open)."""
