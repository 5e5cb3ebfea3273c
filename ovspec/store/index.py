"""The store's index in plain SQLite: one row per entry (JSON text), persistent counters
and settings, a fixed schema. Only a fast path: every row repeats its blob's sidecar, so
a lost row or index is rebuilt from the sidecars.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ovspec.store.layout import fsync_dir, fsync_file

DB_NAME = "index.sqlite3"
# History: 1 — first SQLite index (store format 2, 2026-12).
INDEX_SCHEMA_VERSION = 1

STAT_HITS = "hits"
STAT_MISSES = "misses"
STAT_SAVED_US = "saved_us"  # integer microseconds: sums stay exact
STAT_EVICTIONS = "evictions"
STAT_QUARANTINED = "quarantined"
# The remote's, counted by the local store that moved the bytes.
STAT_REMOTE_HITS = "remote_hits"
STAT_REMOTE_MISSES = "remote_misses"
STAT_REMOTE_REFUSED = "remote_refused"
STAT_REMOTE_FAILURES = "remote_failures"
STAT_REMOTE_FETCHED_BYTES = "remote_fetched_bytes"
STAT_REMOTE_FETCH_US = "remote_fetch_us"
STAT_REMOTE_SAVED_US = "remote_saved_us"
STAT_REMOTE_UPLOADS = "remote_uploads"
STAT_REMOTE_UPLOADED_BYTES = "remote_uploaded_bytes"
STAT_REMOTE_UPLOAD_US = "remote_upload_us"
COUNTERS = (
    STAT_HITS,
    STAT_MISSES,
    STAT_SAVED_US,
    STAT_EVICTIONS,
    STAT_QUARANTINED,
    STAT_REMOTE_HITS,
    STAT_REMOTE_MISSES,
    STAT_REMOTE_REFUSED,
    STAT_REMOTE_FAILURES,
    STAT_REMOTE_FETCHED_BYTES,
    STAT_REMOTE_FETCH_US,
    STAT_REMOTE_SAVED_US,
    STAT_REMOTE_UPLOADS,
    STAT_REMOTE_UPLOADED_BYTES,
    STAT_REMOTE_UPLOAD_US,
)
SIZE_LIMIT_SETTING = "size_limit_bytes"

# How long a statement waits for another process's write transaction.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = (
    "CREATE TABLE entries (hex TEXT PRIMARY KEY NOT NULL, record TEXT NOT NULL, "
    "accessed_unix_s REAL NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)",
    "CREATE TABLE settings (name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)",
)
_TABLES = {"entries", "counters", "settings"}


class IndexDamaged(Exception):
    """The index file cannot be used as ours: not a database, another schema, not a file."""


# Failures of the storage itself (as opposed to bugs): the store fails open on these
# unless strict. A damaged index met after opening is one of them too.
INDEX_ERRORS: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, IndexDamaged)


class Index:
    """Rows, counters and settings in one SQLite file (or in memory).

    A fixed schema of text and number columns: nothing read from the file is unpickled,
    evaluated or followed, and a database whose schema is not exactly ours is damage
    (``IndexDamaged``). What a row must hold is ``records.entry_from_json``'s business.

    ``read_only``: opened ``mode=ro``, or ``immutable`` on a read-only filesystem
    (SQLite then takes no locks, which a read-only mount cannot hold anyway); writes
    are refused by SQLite, and the counting calls (``bump``, ``touch``) do nothing.
    ``path=None``: an in-memory index (a read-only store whose file is damaged is
    served from its sidecars through one of these).

    One connection per ``Index``, shared by the threads of a process under a lock.
    Rollback journal, not WAL: a WAL database cannot be read from a read-only folder
    once its last writer has removed the -shm file, and a read-only team cache is a
    use the store must serve. The writes are a few small rows per compile or lookup.
    """

    def __init__(
        self, path: Path | None, *, read_only: bool = False, immutable: bool = False
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.Lock()
        if path is None:
            self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            _create_schema(self._db)
            return
        _require_regular_or_absent(path)
        if not read_only and not os.path.lexists(path):
            _create_atomically(path)
        flags = "mode=rw"
        if read_only:
            flags = "mode=ro&immutable=1" if immutable else "mode=ro"
        self._db = sqlite3.connect(
            f"file:{_uri_path(path)}?{flags}",
            uri=True,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._db.execute("PRAGMA trusted_schema = OFF")
            if not read_only:
                self._db.execute("PRAGMA synchronous = FULL")
            self._check_schema()
        except BaseException:
            self._db.close()
            raise

    # -- schema ----------------------------------------------------------------------

    def _check_schema(self) -> None:
        try:
            objects = self._db.execute("SELECT type, name, tbl_name FROM sqlite_master").fetchall()
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            # A truncated file can keep a good first page: read every page once (the
            # index is a few KB, this costs a millisecond).
            verdict = [str(r[0]) for r in self._db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                raise IndexDamaged(f"not a readable SQLite database ({exc})") from exc
            raise
        if verdict != ["ok"]:
            found = " ".join(" ".join(verdict[:2]).split())[:200]
            raise IndexDamaged(f"SQLite finds it damaged: {found}")
        if version != INDEX_SCHEMA_VERSION:
            raise IndexDamaged(f"schema version {version}, expected {INDEX_SCHEMA_VERSION}")
        tables = {name for kind, name, _ in objects if kind == "table"}
        extra = [
            f"{kind} {name}"
            for kind, name, table in objects
            if not (kind == "table" and name in _TABLES)
            and not (kind == "index" and name.startswith("sqlite_autoindex_") and table in _TABLES)
        ]
        if tables != _TABLES or extra:
            # Triggers or views would run SQL we did not write; other tables are not ours.
            raise IndexDamaged(f"unexpected schema: tables {sorted(tables)}, also {extra[:3]}")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: take the write lock up front)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite has already rolled back after some errors (a full disk): then a
                # ROLLBACK would fail and hide the error that matters.
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- rows -------------------------------------------------------------------------

    def get_row(self, hex_: str) -> object | None:
        """The row as a JSON object with ``accessed_unix_s``; None if absent.

        A record that is not a JSON object comes back as its text, so the caller's
        parser reports it as malformed rather than this layer crashing.
        """
        found = self._read("SELECT record, accessed_unix_s FROM entries WHERE hex = ?", (hex_,))
        if not found:
            return None
        text: object = found[0][0]
        accessed: object = found[0][1]
        try:
            row: object = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            return text
        if not isinstance(row, dict):
            return text
        return {**row, "accessed_unix_s": accessed}

    def set_row(self, hex_: str, row: dict[str, Any]) -> None:
        record, accessed = _split(row)
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO entries (hex, record, accessed_unix_s) VALUES (?, ?, ?)",
                (hex_, record, accessed),
            )

    def add_row(self, hex_: str, row: dict[str, Any]) -> bool:
        """Insert unless a row exists; whether it was inserted."""
        record, accessed = _split(row)
        with self._write() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO entries (hex, record, accessed_unix_s) VALUES (?, ?, ?)",
                (hex_, record, accessed),
            )
            return cursor.rowcount == 1

    def drop_row(self, hex_: str) -> bool:
        with self._write() as db:
            return db.execute("DELETE FROM entries WHERE hex = ?", (hex_,)).rowcount == 1

    def has_row(self, hex_: str) -> bool:
        return bool(self._read("SELECT 1 FROM entries WHERE hex = ?", (hex_,)))

    def row_hexes(self) -> list[str]:
        return [str(h) for (h,) in self._read("SELECT hex FROM entries ORDER BY hex")]

    def touch(self, hex_: str, now_unix_s: float) -> None:
        """Set a row's access time (LRU); one UPDATE, so it cannot race a rewrite."""
        if self.read_only:
            return
        with self._write() as db:
            db.execute(
                "UPDATE entries SET accessed_unix_s = ? WHERE hex = ?", (float(now_unix_s), hex_)
            )

    # -- counters and settings -----------------------------------------------------------

    def bump(self, name: str, delta: int = 1) -> None:
        if self.read_only:
            return
        with self._write() as db:
            db.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, int(delta)),
            )

    def counter(self, name: str) -> int:
        found = self._read("SELECT value FROM counters WHERE name = ?", (name,))
        value = found[0][0] if found else 0
        return value if isinstance(value, int) else 0

    def reset_counters(self) -> None:
        with self._write() as db:
            db.execute("DELETE FROM counters")

    def size_limit_bytes(self, default: int) -> int:
        found = self._read("SELECT value FROM settings WHERE name = ?", (SIZE_LIMIT_SETTING,))
        try:
            value = int(found[0][0]) if found else default
        except (TypeError, ValueError):
            return default
        return value if value > 0 else default

    def set_size_limit_bytes(self, value: int) -> None:
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)",
                (SIZE_LIMIT_SETTING, str(int(value))),
            )

    # -- self-check ---------------------------------------------------------------------

    def check(self) -> list[str]:
        """Problems of the database file itself (SQLite's integrity check)."""
        try:
            found = [str(r[0]) for r in self._read("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as exc:
            return [f"index: integrity check failed ({exc})"]
        return [] if found == ["ok"] else [f"index: {line}" for line in found[:5]]


def _create_schema(db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {INDEX_SCHEMA_VERSION}")
    db.execute("COMMIT")


def _create_atomically(path: Path) -> None:
    """Write a new index beside ``path``, then link it into place.

    SQLite would create an empty file first and fill it later; another process meeting
    that empty file could not tell it from a truncated index. A linked file is whole.
    Losing the race to another creator is fine: theirs is as good as ours.
    """
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        db = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = DELETE")
            _create_schema(db)
        finally:
            db.close()
        fsync_file(tmp)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _split(row: dict[str, Any]) -> tuple[str, float]:
    record = {k: v for k, v in row.items() if k != "accessed_unix_s"}
    accessed = row.get("accessed_unix_s", record.get("created_unix_s", 0.0))
    return json.dumps(record, sort_keys=True), float(accessed)


def _uri_path(path: Path) -> str:
    # Percent-encode what a URI would read as a delimiter.
    return str(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _require_regular_or_absent(path: Path) -> None:
    """SQLite would follow a link or fail obscurely on a folder: refuse both here. An
    empty file is damage too (SQLite would quietly make it a new, empty index)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise IndexDamaged(f"{path.name} is {kind}")
    if st.st_size == 0:
        raise IndexDamaged(f"{path.name} is empty")


# SQLITE_CORRUPT, SQLITE_NOTADB: the file is damaged. Other errors (busy, locked, cannot
# open for lack of permission, disk full) are about the moment, not the file.
_DAMAGE_CODES = frozenset({11, 26})


def is_damage(exc: BaseException) -> bool:
    """Does ``exc`` say the index file is damaged (rather than busy or unwritable)?"""
    if isinstance(exc, IndexDamaged):
        return True
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return (int(code) & 0xFF) in _DAMAGE_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text
