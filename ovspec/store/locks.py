"""Per-key cross-process locks: an exclusive ``flock`` on ``locks/<hex>.lock``, dropped by
the kernel when its holder dies; waits are bounded (``LockPolicy``) and a waiter that
gives up names the holder's pid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_LOCK_WAIT_S = "OVSPEC_LOCK_WAIT_S"
_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.1


@dataclass(frozen=True)
class LockPolicy:
    """How long a waiter waits for a key's lock.

    ``wait_s``: the longest wait while the holder is running (a long compile is a
    legitimate reason to wait). ``stopped_s``: the longest wait once the holder is seen
    stopped or dead-but-unreaped; it is not coming back soon.
    """

    wait_s: float = 3600.0
    stopped_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("wait_s", "stopped_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"lock {name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def from_env(cls) -> LockPolicy:
        """The default policy, with ``$OVSPEC_LOCK_WAIT_S`` as ``wait_s`` when set."""
        text = os.environ.get(ENV_LOCK_WAIT_S, "").strip()
        if not text:
            return cls()
        try:
            wait_s = float(text)
        except ValueError as exc:
            raise ValueError(f"{ENV_LOCK_WAIT_S}={text!r} is not a number of seconds") from exc
        return cls(wait_s=wait_s, stopped_s=min(cls.stopped_s, wait_s))


class LockTimeout(Exception):
    """A waiter gave up on a lock; names its holder."""

    def __init__(self, path: Path, holder_pid: int | None, state: str, waited_s: float) -> None:
        self.path = path
        self.holder_pid = holder_pid
        self.state = state
        self.waited_s = waited_s
        who = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(f"{who} ({state}) has held {path.name} for the {waited_s:.1f} s waited")


def holder_pid(path: Path) -> int | None:
    """The pid the current holder wrote into the lock file, if any."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


def process_state(pid: int | None) -> str:
    """'running', 'stopped', 'zombie', 'gone' or 'unknown' (not Linux, another pid space)."""
    if pid is None:
        return "unknown"
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "unknown"
    # The command name is in parentheses and may contain anything: state follows the last ')'.
    state = text.rpartition(")")[2].split()[:1]
    code = state[0] if state else "?"
    return {"T": "stopped", "t": "stopped", "Z": "zombie", "X": "gone"}.get(code, "running")


class KeyLock:
    """An exclusive ``flock`` on one lock file; one fd per acquisition.

    flock needs a local filesystem (it is unreliable over NFS, as is SQLite's locking
    under the index). It belongs to an open file description, so two threads of one
    process exclude each other because each acquisition opens the file itself.

    gc() may unlink an idle lock file while holding it, so after locking we check
    that the path still names the inode we locked, and retry otherwise (the
    classic flock-and-unlink race). The file is opened with O_NOFOLLOW: a link
    planted in locks/ fails the open instead of creating a file elsewhere.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self._path

    def _try_once(self) -> bool | None:
        """True: locked; False: busy; None: the path moved under us, try again."""
        fd = os.open(
            self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(self._path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return None
        self._fd = fd
        with contextlib.suppress(OSError):  # the note is for waiters' messages only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return True

    def acquire(self, *, blocking: bool, policy: LockPolicy | None = None) -> bool:
        """Take the lock. Non-blocking: whether it was free. Blocking: wait under
        ``policy`` (default: ``LockPolicy()``), raising ``LockTimeout`` past its bounds."""
        policy = policy or LockPolicy()
        began = time.monotonic()
        stopped_since: float | None = None
        pause = _POLL_FIRST_S
        while True:
            got = self._try_once()
            if got:
                return True
            if got is None:
                continue
            if not blocking:
                return False
            now = time.monotonic()
            pid = holder_pid(self._path)
            state = process_state(pid)
            if state in ("stopped", "zombie"):
                stopped_since = now if stopped_since is None else stopped_since
            else:
                stopped_since = None
            waited = now - began
            if waited >= policy.wait_s or (
                stopped_since is not None and now - stopped_since >= policy.stopped_s
            ):
                raise LockTimeout(self._path, pid, state, waited)
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last fd of the description drops the flock
            self._fd = None


@contextlib.contextmanager
def try_lock(path: Path, *, held: bool = False) -> Iterator[bool]:
    """Yield whether this caller may change the key's files (non-blocking).

    ``held``: the caller already holds the key's lock (yields True, locks nothing).
    A lock path that cannot be opened (a folder or a link in its place) counts as
    busy: whoever cannot lock a key leaves its files alone.
    """
    if held:
        yield True
        return
    lock = KeyLock(path)
    try:
        got = lock.acquire(blocking=False)
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EROFS):
            raise
        got = False
    try:
        yield got
    finally:
        lock.release()


@contextlib.contextmanager
def try_lock_folder(path: Path) -> Iterator[bool]:
    """Yield whether this caller may remove the real folder at ``path`` now: an
    exclusive flock on the folder itself, without waiting. A model folder in use or
    being written is held shared by its user (``ovspec.ir.materialize``) and is busy
    here; a link or a file in its place is never opened (False)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
