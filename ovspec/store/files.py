"""The files of one entry: hashing and verifying its payload, reading and atomically
writing its sidecar, quarantine and deletion. Nothing here follows a link.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

import xxhash

from ovspec.store.digests import size_and_digest
from ovspec.store.layout import STORE_FORMAT_VERSION, StoreLayout, fsync_dir
from ovspec.store.records import StoreEntry, Verdict, entry_from_json, record_json

# What ``hash_file`` reports for a path that is there but is not a regular file.
NOT_A_FILE: tuple[int, str] = (-1, "not a regular file")


def hash_file(path: Path) -> tuple[int, str] | None:
    """(size, xxh3-128 hex) of a regular file; None if absent; ``NOT_A_FILE`` for a
    link, a folder, a FIFO or anything else (never opened: lstat first, and the open
    itself refuses what is not a regular file without blocking)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return NOT_A_FILE
        return size_and_digest(path, follow_links=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES):
            return NOT_A_FILE
        raise


def unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_path(path: Path) -> bool:
    """Delete a file, a link (not its target) or a whole folder; False if absent.

    ``shutil.rmtree`` walks by file descriptor and never follows a link inside the
    tree (``shutil.rmtree.avoids_symlink_attacks`` on Linux)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
        return True
    return unlink(path)


def is_regular(path: Path) -> bool | None:
    """True: a regular file; False: something else (link, folder...); None: absent."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def verify(entry: StoreEntry) -> Verdict:
    """Does the payload on disk match ``entry``'s size and checksum?"""
    try:
        st = os.lstat(entry.path)
    except FileNotFoundError:
        return Verdict.MISSING
    if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size_bytes:
        return Verdict.CORRUPT  # no need to hash a file of the wrong length
    measured = hash_file(entry.path)
    if measured is None:
        return Verdict.MISSING
    if measured != (entry.size_bytes, entry.checksum):
        return Verdict.CORRUPT
    return Verdict.OK


def map_verified(entry: StoreEntry) -> tuple[Verdict, mmap.mmap | None]:
    """Map the payload copy-on-write and verify the mapping's bytes.

    What is verified is what the caller will read: the mapping keeps the inode alive,
    so an eviction or a ``clear`` by another process after this call cannot pull the
    bytes away or swap them. Copy-on-write because OpenVINO wants a writable buffer;
    nothing is written back to the file.
    """
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return Verdict.MISSING, None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return Verdict.CORRUPT, None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size_bytes or st.st_size == 0:
            return Verdict.CORRUPT, None
        mapping = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    if xxhash.xxh3_128_hexdigest(mapping) != entry.checksum:
        mapping.close()
        return Verdict.CORRUPT, None
    return Verdict.OK, mapping


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of the regular file at ``path``, never through a link
    (ELOOP) and never blocking on a FIFO (O_NONBLOCK): anything else raises OSError
    (EISDIR for a folder, a device or a FIFO)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", str(path))
        return f.read(max_bytes)


class EntryFiles:
    """Payload and sidecar operations under one store layout. The caller holds the key's
    lock for anything that changes files. Payloads and sidecars are opened with
    O_NOFOLLOW; a link, a folder or anything else that is not a regular file where one
    should be is damage (moved aside), never read through."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout

    def read_sidecar(self, hex_: str) -> StoreEntry | None:
        """The sidecar of ``hex_``; None if absent. ValueError if malformed (or not a
        regular file)."""
        try:
            raw = read_regular_file(self.layout.sidecar_path(hex_), 1 << 20)
        except FileNotFoundError:
            return None
        except IsADirectoryError as exc:
            raise ValueError("sidecar is not a regular file") from exc
        except OSError as exc:
            raise ValueError(f"sidecar cannot be read as a file ({exc.strerror})") from exc
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"sidecar is not JSON: {exc}") from exc
        entry = entry_from_json(obj, self.layout.payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"sidecar names hex {entry.hex}")
        return entry

    def write_sidecar(self, entry: StoreEntry) -> None:
        tmp = self.layout.new_temp(entry.hex, "json")
        try:
            data = json.dumps(
                {"store_format": STORE_FORMAT_VERSION, **record_json(entry)}, indent=1
            ).encode()
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            dest = self.layout.sidecar_path(entry.hex)
            self.clear_way(dest)
            os.replace(tmp, dest)
            fsync_dir(dest.parent)
        except BaseException:
            unlink(tmp)
            raise

    def clear_way(self, dest: Path) -> None:
        """Move aside whatever non-file (a folder, a link) stands where a file goes."""
        if is_regular(dest) is False:
            self.move_to_quarantine(dest)

    def move_to_quarantine(self, path: Path) -> bool:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        dest = self.layout.quarantine / f"{path.name}.{stamp}.{secrets.token_hex(2)}"
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return False
        return True

    def quarantine_payload_and_sidecar(self, hex_: str) -> bool:
        """Move both aside; whether there was a payload to move."""
        moved = self.move_to_quarantine(self.layout.payload_path(hex_))
        self.move_to_quarantine(self.layout.sidecar_path(hex_))
        return moved

    def delete_payload_and_sidecar(self, hex_: str) -> None:
        unlink(self.layout.payload_path(hex_))
        unlink(self.layout.sidecar_path(hex_))


def scan_folder(folder: Path) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of each entry of a real folder, sorted; [] if it is not one."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        with os.scandir(folder) as it:
            found = []
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    found.append((e.name, e.stat(follow_symlinks=False)))
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda x: x[0])
