"""One open store folder as the local store's modules share it: its layout, access,
index, entry files and key locks, and how faults are reported (warn, fail open, strict).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from ovspec.errors import StoreError, arg
from ovspec.store import opening
from ovspec.store.files import EntryFiles
from ovspec.store.index import INDEX_ERRORS, STAT_QUARANTINED
from ovspec.store.layout import ENV_ROOT, StoreLayout
from ovspec.store.locks import KeyLock, LockPolicy, try_lock
from ovspec.store.records import StoreEntry, StoreWarning, entry_from_json, row_json

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT_BYTES = 20 * 2**30


class StoreCore:
    """An opened store folder (``opening`` decides whether it may be used, and how).

    ``index`` and ``access`` change when maintenance rebuilds the index or replaces a
    link with a folder; everything else is fixed once opened.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        strict: bool,
        trust_shared: bool,
        repair: bool,
        lock_policy: LockPolicy | None,
        create: bool,
    ) -> None:
        # The root may be a link the user chose; below it, nothing is followed.
        self.layout = StoreLayout(Path(root).expanduser().resolve())
        if not create and not self.layout.format_file.is_file():
            raise StoreError(
                f"no ovspec store at {self.layout.root}; check {arg('root')}, or build one "
                "with `ovspec build`"
            )
        self.strict = strict
        self._warned: set[str] = set()
        try:
            self.lock_policy = lock_policy or LockPolicy.from_env()
        except ValueError as exc:
            raise StoreError(str(exc)) from exc
        self.access = opening.prepare(self.layout, trust_shared=trust_shared, repair=repair)
        self.files = EntryFiles(self.layout)
        try:
            self.index = opening.open_index(
                self.layout,
                self.access,
                self.lock_policy,
                self.warn,
                usable="index" not in self.access.report.bad_paths,
            )
        except INDEX_ERRORS as exc:
            raise StoreError(
                f"cache folder {self.layout.root}: its index cannot be opened ({exc}); "
                f"pass {arg('root')} or set {ENV_ROOT}"
            ) from exc
        if not self.read_only and not self.access.report.links:
            with contextlib.suppress(OSError):  # a leak to clean, not a reason to fail
                opening.remove_stale_temps(self.layout, time.time())

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def read_only(self) -> bool:
        return self.access.read_only

    @property
    def size_limit_bytes(self) -> int:
        return self.index.size_limit_bytes(DEFAULT_SIZE_LIMIT_BYTES)

    # -- reporting faults --------------------------------------------------------------

    def warn(self, message: str) -> None:
        """One ``StoreWarning`` per distinct message and open store. Not also a log
        record at WARNING: with logging unconfigured, Python would print both."""
        message = " ".join(message.split())  # one line, whatever an OS error said
        if message in self._warned:
            return
        self._warned.add(message)
        log.debug("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=3)

    def fail_open(self, what: str, exc: BaseException) -> None:
        """Storage failure: raise when strict, else warn and let the caller go on."""
        message = f"blob store {self.root}: {what} ({exc})"
        if self.strict:
            raise StoreError(message) from exc
        self.warn(message)

    def require_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(f"blob store {self.root} is read-only here; cannot {what}")

    @contextlib.contextmanager
    def locked_io(self, what: str) -> Iterator[None]:
        """Maintenance operations surface storage failures as StoreError."""
        try:
            yield
        except INDEX_ERRORS as exc:
            raise StoreError(f"blob store {self.root}: cannot {what} ({exc})") from exc

    def count(self, name: str, delta: int = 1) -> None:
        """Add to a persistent counter; a counter that cannot be kept fails open."""
        try:
            self.index.bump(name, delta)
        except INDEX_ERRORS as exc:
            self.fail_open("cannot update statistics", exc)

    # -- one key's row, lock and files -------------------------------------------------

    def row(self, hex_: str) -> StoreEntry | None:
        """The index row of ``hex_``; None if absent. ValueError if malformed."""
        row = self.index.get_row(hex_)
        if row is None:
            return None
        entry = entry_from_json(row, self.layout.payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"row names hex {entry.hex}")
        return entry

    def set_row(self, entry: StoreEntry) -> None:
        self.index.set_row(entry.hex, row_json(entry))

    def key_lock(self, hex_: str) -> KeyLock:
        return KeyLock(self.layout.lock_path(hex_))

    def try_lock(self, hex_: str, *, held: bool = False) -> contextlib.AbstractContextManager[bool]:
        """Whether this caller may change ``hex_``'s files now (non-blocking)."""
        return try_lock(self.layout.lock_path(hex_), held=held)

    def quarantine_entry(self, hex_: str) -> None:
        """Move payload and sidecar aside and drop the row. Caller holds the lock."""
        moved = self.files.quarantine_payload_and_sidecar(hex_)
        self.index.drop_row(hex_)
        if moved:
            self.index.bump(STAT_QUARANTINED)

    def delete_entry_files(self, hex_: str) -> bool:
        """Drop the row, then the payload, then the sidecar. Caller holds the lock.

        Row first: a crash in between leaves payload+sidecar, which lookup or
        check(fix=True) re-index, never a row pointing at nothing. Returns whether
        there was a row (False: another process removed it first).
        """
        had_row = self.index.drop_row(hex_)
        self.files.delete_payload_and_sidecar(hex_)
        return had_row
