"""The store's folder on disk: the names under the root (cache/README.md is the
contract), the patterns that tell the store's files from anything else, and the FORMAT
stamp saying which store format a folder holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from ovspec.errors import StoreError, arg

# History: 1 — first layout (2026-11): diskcache index, blobs/<hex[:2]>/ with JSON
# sidecars, tmp/, quarantine/, locks/.
# 2 — (2026-12) the index is plain SQLite (index/index.sqlite3: text and
# number columns, no pickles); folders are created owner-only; the digest memo is one
# JSON file per model file. Blobs and sidecars are unchanged, so a format-1 store is
# migrated on its first writable open: its diskcache index is deleted unread and
# rebuilt from the sidecars.
STORE_FORMAT_VERSION = 2
MIGRATABLE_FORMATS = frozenset({1})
FORMAT_MAGIC = "ovspec-store"
ENV_ROOT = "OVSPEC_CACHE_DIR"

HEX_RE = re.compile(r"[0-9a-f]{32}")
PAYLOAD_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.blob")
SIDECAR_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.json")
TEMP_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.\d+\.[0-9a-f]+\.(blob|json)\.part")
LOCK_RE = re.compile(r"(?P<hex>[0-9a-f]{32})\.lock")
STORE_LOCK_NAME = "store.lock"  # in locks/: serializes index recovery and migration
# Folders the store creates: owner-only, whatever the umask (see ovspec/store/trust.py).
FOLDER_MODE = 0o700
# models/ (built-in models) and digests/ (file-digest memo) belong to ovspec, not the index.
ROOT_NAMES = frozenset(
    {"FORMAT", "index", "blobs", "tmp", "quarantine", "locks", "models", "digests"}
)


def default_root() -> Path:
    """``$OVSPEC_CACHE_DIR`` if set, else the user cache folder for ovspec."""
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("ovspec"))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StoreLayout:
    """The paths of one store root (absolute)."""

    root: Path

    @property
    def format_file(self) -> Path:
        return self.root / "FORMAT"

    @property
    def index(self) -> Path:
        return self.root / "index"

    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def digests(self) -> Path:
        return self.root / "digests"

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders every writable store has (models/ and digests/ come on demand)."""
        return (self.index, self.blobs, self.tmp, self.quarantine, self.locks)

    @property
    def index_db(self) -> Path:
        return self.index / "index.sqlite3"

    @property
    def store_lock(self) -> Path:
        return self.locks / STORE_LOCK_NAME

    def payload_path(self, hex_: str) -> Path:
        return self.blobs / hex_[:2] / f"{hex_}.blob"

    def sidecar_path(self, hex_: str) -> Path:
        return self.blobs / hex_[:2] / f"{hex_}.json"

    def lock_path(self, hex_: str) -> Path:
        return self.locks / f"{hex_}.lock"

    def new_temp(self, hex_: str, suffix: str) -> Path:
        """A fresh empty file in tmp/ whose name says which key and process wrote it."""
        path = self.tmp / f"{hex_}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}.part"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        return path

    def read_format(self) -> int | None:
        """The store format this folder holds; None if it has no FORMAT file.

        StoreError when the FORMAT file is not ours (another tool's folder)."""
        try:
            raw = self.format_file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(
                f"cache folder {self.root}: cannot read its FORMAT file ({exc.strerror or exc})"
            ) from exc
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = None
        magic, _, version = (text or "").partition(" ")
        if text is None or magic != FORMAT_MAGIC or not version.isdigit():
            shown = repr(text[:40]) if text is not None else "bytes that are not text"
            raise StoreError(
                f"folder {self.root} is not an ovspec store (FORMAT says {shown}); "
                f"pass another {arg('root')}"
            )
        return int(version)

    def check_format(self, version: int) -> None:
        """Refuse a format this ovspec cannot read (nor migrate)."""
        if version == STORE_FORMAT_VERSION or version in MIGRATABLE_FORMATS:
            return
        newer = "a newer" if version > STORE_FORMAT_VERSION else "an older"
        raise StoreError(
            f"cache folder {self.root} has store format {version}, written by {newer} "
            f"ovspec; this one reads format {STORE_FORMAT_VERSION}; "
            f"pass another {arg('root')} or use a matching ovspec"
        )

    def stamp_format(self) -> None:
        """Write FORMAT (temp file, fsync, rename)."""
        tmp = self.root / f".FORMAT.{os.getpid()}.{secrets.token_hex(4)}"
        tmp.write_text(f"{FORMAT_MAGIC} {STORE_FORMAT_VERSION}\n", encoding="utf-8")
        fsync_file(tmp)
        os.replace(tmp, self.format_file)
        fsync_dir(self.root)

    def ensure_format(self) -> int:
        """Stamp an empty (or ovspec-only) folder as a store; refuse anything else.

        Returns the format the folder held (``STORE_FORMAT_VERSION`` once stamped)."""
        version = self.read_format()
        if version is not None:
            self.check_format(version)
            return version
        foreign = sorted(
            p.name
            for p in self.root.iterdir()
            if p.name not in ROOT_NAMES and not p.name.startswith((".FORMAT.", ".probe."))
        )
        if foreign:
            raise StoreError(
                f"folder {self.root} is not an ovspec store (no FORMAT file) and holds "
                f"{', '.join(foreign[:3])}; pass an empty or new {arg('root')}"
            )
        self.stamp_format()
        return STORE_FORMAT_VERSION

    def make_folders(self) -> None:
        """Create the store's folders that are missing, owner-only."""
        for folder in self.folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, FOLDER_MODE)
