"""Model folders ovspec writes into a store's ``models/`` (built-in presets, GGUF
imports): written once into a staging folder and renamed into place, never reached
through a link, refused when another user owns them, and held while in use.

Held: a shared flock on the folder itself, kept until the process exits. ``cache
clear`` and ``gc`` remove a model folder only under an exclusive flock taken without
waiting (``store.locks.try_lock_folder``), so a folder a process reads (its IR, the
weights a weightless blob points into) or is still writing is never removed under it
(issue 29: a concurrent clear gave FileNotFoundError tracebacks and failed imports).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ovspec.errors import ModelError
from ovspec.ir.files import IR_XML_NAME

# The store's gc removes model folders whose marker is older than a week.
LAST_USED_NAME = ".last-used"
# models/ is a store folder: owner-only, as the store creates its others (cache/README.md).
MODELS_FOLDER_MODE = 0o700
# A folder removed (by a concurrent clear) between being written and being locked is
# written again; after this many rounds the caller is told to retry.
ATTEMPTS = 5
# How long to wait for a remover's exclusive lock to go (it is held only while removing).
REMOVER_WAIT_S = 60.0

_held: dict[Path, int] = {}  # folder -> the fd holding its shared lock (process lifetime)
_held_lock = threading.Lock()

Writer = Callable[[Path], None]


def hold_model(folder: Path, write: Writer) -> Path:
    """``folder`` (under a store's ``models/``) with its IR, written by ``write`` into an
    empty staging folder if missing, and held (shared flock) until this process exits.

    ModelError (one line) for a link or a non-folder there, a folder another user owns,
    a folder without an IR, or one removed again and again while being written."""
    with _held_lock:
        known = _held.get(folder)
        if known is not None and _same(folder, known):
            mark_used(known)
            return folder
        for _ in range(ATTEMPTS):
            fd = _lock_shared(folder)
            if fd is not None:
                found = _contents(fd)
                if found != "ir":  # an empty folder (a repaired link) is written over
                    os.close(fd)
                    fd = None
                if found == "other":
                    raise ModelError(
                        f"model folder {folder} exists but holds no {IR_XML_NAME}; run "
                        f"`ovspec cache check --fix --cache-dir {folder.parent.parent}` "
                        "or remove it"
                    )
            if fd is None:
                fd = _write_staged(folder, write)
            if fd is None:
                continue  # lost to a concurrent writer or remover: look again
            try:
                _check_owned(folder)
            except BaseException:
                os.close(fd)
                raise
            if known is not None:
                os.close(known)
            _forget_gone()
            _held[folder] = fd
            mark_used(fd)
            return folder
    raise ModelError(
        f"model folder {folder} was removed {ATTEMPTS} times while being written (a "
        "concurrent `ovspec cache clear`?); run the command again"
    )


def _forget_gone() -> None:
    """Drop the holds of folders no longer there (a test's temp store, removed): a
    long-lived process keeps one fd per model folder it uses, not one per folder ever."""
    for folder, fd in list(_held.items()):
        if not _same(folder, fd):
            os.close(fd)
            del _held[folder]


def _not_followed(folder: Path, what: str) -> str:
    return (
        f"model folder {folder} is {what}; ovspec never follows links in its store nor uses "
        "a model another user can change. Run "
        f"`ovspec cache check --fix --cache-dir {folder.parent.parent}` to remove it"
    )


def _same(folder: Path, fd: int) -> bool:
    """Whether ``folder`` is still the (real) folder ``fd`` has open."""
    try:
        now = os.lstat(folder)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return stat.S_ISDIR(now.st_mode) and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _lock_shared(folder: Path) -> int | None:
    """An fd of the real folder at ``folder`` holding a shared lock; None if there is
    none (or it was removed or replaced before the lock was taken)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(folder) else "not a folder"
            raise ModelError(_not_followed(folder, kind)) from None
        raise ModelError(f"cannot open model folder {folder} ({exc.strerror})") from None
    try:
        deadline = time.monotonic() + REMOVER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # A remover holds it: the folder is on its way out; wait, then see.
                if time.monotonic() > deadline:
                    raise ModelError(
                        f"model folder {folder} stayed locked by a remover for "
                        f"{REMOVER_WAIT_S:.0f} s; run the command again"
                    ) from None
                time.sleep(0.05)
        if _same(folder, fd):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _contents(fd: int) -> str:
    """What the held folder holds: "ir" (its IR file), "empty" or "other"."""
    try:
        st = os.stat(IR_XML_NAME, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "other" if os.listdir(fd) else "empty"
    return "ir" if stat.S_ISREG(st.st_mode) else "other"


def _write_staged(folder: Path, write: Writer) -> int | None:
    """Write the model into a staging folder held shared, rename it to ``folder``;
    the fd that holds it now, or None if a concurrent writer won or a remover took the
    staging folder before it was locked."""
    models = folder.parent
    try:
        os.makedirs(models, MODELS_FOLDER_MODE, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=models))
    except FileNotFoundError:
        return None  # models/ removed by a clear between the two calls
    except OSError as exc:
        raise ModelError(f"cannot write model folder {folder}: {exc}") from exc
    fd = _lock_shared(staging)
    if fd is None:
        return None
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it 0700; models/ itself is owner-only
        try:
            # rename(2) replaces a missing or empty folder; a writer that won the race
            # makes it fail with ENOTEMPTY, and its folder is as good as ours.
            os.replace(staging, folder)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            os.close(fd)
            shutil.rmtree(staging, ignore_errors=True)
            return None
    except OSError as exc:
        os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelError(f"cannot write model folder {folder}: {exc}") from exc
    except BaseException:
        os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return fd


def _check_owned(folder: Path) -> None:
    """Refuse a model folder (or a file in it) that is a link or another user's: they
    could rewrite its weights under us. Group and world write bits are ``cache check``'s
    (store.trust), which knows the private-group rule."""
    euid = os.geteuid()
    for path in (folder, *_entries(folder)):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise ModelError(_not_followed(folder, f"not usable ({path.name} is a link)"))
        if st.st_uid != euid:
            raise ModelError(_not_followed(folder, f"owned by another user (uid {st.st_uid})"))


def _entries(folder: Path) -> list[Path]:
    with os.scandir(folder) as it:
        return [Path(e.path) for e in it]


def mark_used(fd: int) -> None:
    """Touch the held folder's last-used marker, never through a link (best effort: a
    read-only store keeps none)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        marker = os.open(LAST_USED_NAME, flags, 0o600, dir_fd=fd)
        try:
            os.utime(marker)
        finally:
            os.close(marker)
