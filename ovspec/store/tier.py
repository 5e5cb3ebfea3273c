"""The remote tier behind one local store: fetch on a local miss, upload after a compile.

``Store.get_or_create`` goes through here when a remote is attached. Under the key's
lock, a local miss asks the remote before the producer: a fetched payload is verified
(``Remote.fetch``), proven importable (``validate``) and committed like a compiled one
(``publish.commit``, with the checksum the manifest names). A blob compiled here is
uploaded on a background thread once the local commit is done and the lock released.
The remote never fails a build: each failure is one ``RemoteWarning`` and a compile
(``strict``: raised instead), and a remote found unreachable is not asked again by this
store. ``push`` and ``pull`` move whole ladders on request. Counts go to the index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ovspec.errors import (
    RemoteError,
    RemoteIntegrityError,
    RemoteUnavailableError,
    StoreError,
)
from ovspec.store import index as counters
from ovspec.store.files import unlink
from ovspec.store.index import INDEX_ERRORS
from ovspec.store.keys import BlobKey
from ovspec.store.manifest import Manifest
from ovspec.store.records import BlobOutcome, ProducedBlob, StoreWarning
from ovspec.store.remote import PublishOutcome, Remote

if TYPE_CHECKING:
    from ovspec.store.local import Store

log = logging.getLogger(__name__)

Producer = Callable[[Path], ProducedBlob]
Validator = Callable[[Path], None]
# Metadata a fetch adds to the local record; never uploaded again.
FETCHED_FROM = "fetched_from"
FETCH_S = "fetch_s"


class RemoteWarning(StoreWarning):
    """The remote tier failed or sent something refused; the blob was compiled instead."""


class TransferStatus(Enum):
    LOCAL = "local"  # pull: the local store has it already
    PULLED = "pulled"
    PUBLISHED = "published"  # push: uploaded, our manifest is the remote's
    ON_REMOTE = "on_remote"  # push: the remote has it already
    MISSING = "missing"  # pull: not on the remote; push: not in the local store
    REFUSED = "refused"  # pull: failed verification or import; push: changed on disk
    UNAVAILABLE = "unavailable"  # the remote could not be reached

    @property
    def ok(self) -> bool:
        return self in (self.LOCAL, self.PULLED, self.PUBLISHED, self.ON_REMOTE)


@dataclass(frozen=True)
class Transfer:
    """One key pushed or pulled."""

    hex: str
    status: TransferStatus
    moved_bytes: int = 0
    seconds: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.hex,
            "status": self.status.value,
            "moved_bytes": self.moved_bytes,
            "seconds": self.seconds,
            "note": self.note,
        }


class _NotFetched(Exception):
    """pull: the remote did not provide the blob (the reason is recorded apart)."""


@dataclass(frozen=True)
class _Fetched:
    produced: ProducedBlob
    seconds: float


class Tier:
    """One local store with a remote behind it."""

    def __init__(self, store: Store, remote: Remote, *, strict: bool = False) -> None:
        self.store = store
        self.remote = remote
        self.strict = strict
        self._lock = threading.Lock()
        self._down: str | None = None  # why the remote is not asked any more
        self._warned: set[str] = set()
        self._uploader: ThreadPoolExecutor | None = None
        self._uploads: list[Future[None]] = []
        self._upload_error: RemoteError | None = None
        self._closed = False
        # This process's uploads (the index counts every process's).
        self.uploaded = 0
        self.uploaded_bytes = 0

    @property
    def down(self) -> str | None:
        return self._down

    # -- failing open ---------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        message = " ".join(message.split())
        with self._lock:
            if message in self._warned:
                return
            self._warned.add(message)
        log.debug("%s", message)
        warnings.warn(message, RemoteWarning, stacklevel=4)

    def _count(self, name: str, delta: int = 1) -> None:
        try:
            self.store.index.bump(name, delta)
        except INDEX_ERRORS as exc:
            self.store.fail_open("cannot update statistics", exc)

    def _failed(self, what: str, exc: RemoteError) -> None:
        """A remote failure: counted, then raised when strict, else one warning."""
        if isinstance(exc, RemoteUnavailableError):
            with self._lock:
                first = self._down is None
                self._down = str(exc)
            if first:
                self._count(counters.STAT_REMOTE_FAILURES)
            if self.strict:
                raise exc
            self._warn(
                f"remote {self.remote.url}: {exc}; {what} locally, and not asking the remote "
                "again in this process"
            )
            return
        self._count(counters.STAT_REMOTE_REFUSED)
        if self.strict:
            raise exc
        self._warn(f"remote {self.remote.url}: {exc}; {what} locally")

    # -- reads ----------------------------------------------------------------------------

    def get_or_create(
        self,
        key: BlobKey,
        produce: Producer,
        validate: Validator | None,
        map_payload: bool,
    ) -> BlobOutcome:
        """``Store.get_or_create`` with the remote between the local store and ``produce``."""
        fetched: list[_Fetched] = []

        def obtain(path: Path) -> ProducedBlob:
            got = self._fetch_into(key, path, validate)
            if got is None:
                return produce(path)
            fetched.append(got)
            return got.produced

        def check(path: Path) -> None:
            if not fetched and validate is not None:  # a fetched payload was checked already
                validate(path)

        outcome = self.store.get_or_create_local(
            key, obtain, validate=check, map_payload=map_payload
        )
        if fetched:
            return dataclasses.replace(outcome, fetched=True, fetch_s=fetched[-1].seconds)
        if not outcome.hit and outcome.stored:
            self.upload_later(key, outcome)
        return outcome

    def _fetch_into(
        self,
        key: BlobKey,
        path: Path,
        validate: Validator | None,
        errors: list[RemoteError] | None = None,
    ) -> _Fetched | None:
        """The remote's payload of ``key`` at ``path``, verified and (with ``validate``)
        importable; None when it has none or failed (warned, or added to ``errors``)."""
        if self._down is not None:
            if errors is not None:
                errors.append(RemoteUnavailableError(self._down))
            return None
        short = key.hex[:12]
        began = time.perf_counter()
        try:
            manifest = self.remote.fetch(key, path)
        except RemoteError as exc:
            if errors is None:
                self._failed(f"compiling {short}", exc)
            else:
                errors.append(exc)
                if isinstance(exc, RemoteUnavailableError):
                    self._down = str(exc)
            return None
        if manifest is None:
            self._count(counters.STAT_REMOTE_MISSES)
            return None
        fetch_s = time.perf_counter() - began
        if validate is not None:
            try:
                validate(path)
            except Exception as exc:  # the device's verdict, whatever its exception type
                unlink(path)
                refused = RemoteIntegrityError(
                    f"blob {short} verifies against its manifest but does not import ({exc})"
                )
                if errors is None:
                    self._failed(f"compiling {short}", refused)
                else:
                    errors.append(refused)
                return None
        size = manifest.payload.size_bytes
        self._count(counters.STAT_REMOTE_HITS)
        self._count(counters.STAT_REMOTE_FETCHED_BYTES, size)
        self._count(counters.STAT_REMOTE_FETCH_US, round(fetch_s * 1e6))
        self._count(counters.STAT_REMOTE_SAVED_US, manifest.compile_us)
        metadata = {
            **manifest.metadata,
            FETCHED_FROM: self.remote.url,
            FETCH_S: f"{fetch_s:.6f}",
        }
        produced = ProducedBlob(
            compile_s=manifest.compile_s,
            metadata=metadata,
            size_bytes=size,
            checksum=manifest.payload.xxh3_128,
        )
        return _Fetched(produced, fetch_s)

    def has(self, key: BlobKey) -> bool:
        """Whether the remote names ``key`` (a hint: nothing is verified); False if down."""
        if self._down is not None:
            return False
        try:
            return self.remote.has(key)
        except RemoteError as exc:
            self._failed("working", exc)
            return False

    def manifest(self, key: BlobKey) -> Manifest | None:
        """The remote's verified manifest of ``key`` (its compile time, payload size and
        metadata); None if absent, or failed (warned)."""
        if self._down is not None:
            return None
        try:
            return self.remote.manifest(key)
        except RemoteError as exc:
            self._failed("working", exc)
            return None

    # -- uploads --------------------------------------------------------------------------

    def upload_later(self, key: BlobKey, outcome: BlobOutcome) -> None:
        """Queue the upload of a blob just committed; returns at once."""
        if self.remote.read_only or self._down is not None or outcome.checksum is None:
            return
        meta = {k: v for k, v in outcome.metadata.items() if k not in (FETCHED_FROM, FETCH_S)}
        with self._lock:
            if self._closed:
                return
            if self._uploader is None:
                self._uploader = ThreadPoolExecutor(1, thread_name_prefix="ovspec-upload")
            future = self._uploader.submit(
                self._upload_quietly, key, outcome.path, outcome.checksum, outcome.compile_s, meta
            )
            self._uploads.append(future)

    def _upload_quietly(
        self, key: BlobKey, path: Path, checksum: str, compile_s: float, metadata: dict[str, str]
    ) -> None:
        if self._down is not None:
            return
        try:
            self._upload(key, path, checksum, compile_s, metadata)
        except RemoteError as exc:
            if self.strict:
                with self._lock:
                    self._upload_error = self._upload_error or exc
                return
            self._failed(f"kept blob {key.hex[:12]}", exc)
        except (OSError, ValueError) as exc:
            # Evicted, removed or changed since its commit: nothing verified to upload.
            log.debug("not uploading %s: %s", key.hex[:12], exc)
        except Exception as exc:  # a bug, or a client error of a kind not mapped yet
            self._warn(f"upload of blob {key.hex[:12]} to {self.remote.url} failed ({exc!r})")

    def _upload(
        self, key: BlobKey, path: Path, checksum: str, compile_s: float, metadata: Mapping[str, str]
    ) -> Transfer:
        began = time.perf_counter()
        # The inode open now is the one hashed and sent, whatever replaces the name.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        with open(fd, "rb") as file:
            published = self.remote.publish(key, file, compile_s, metadata, expected_xxh3=checksum)
        seconds = time.perf_counter() - began
        with self._lock:
            self.uploaded += published.outcome is PublishOutcome.PUBLISHED
            self.uploaded_bytes += published.uploaded_bytes
        if published.outcome is PublishOutcome.PUBLISHED:
            self._count(counters.STAT_REMOTE_UPLOADS)
        if published.uploaded_bytes:
            self._count(counters.STAT_REMOTE_UPLOADED_BYTES, published.uploaded_bytes)
            self._count(counters.STAT_REMOTE_UPLOAD_US, round(seconds * 1e6))
        status = (
            TransferStatus.PUBLISHED
            if published.outcome is PublishOutcome.PUBLISHED
            else TransferStatus.ON_REMOTE
        )
        return Transfer(key.hex, status, published.uploaded_bytes, seconds)

    def wait_for_uploads(self) -> None:
        """Block until every queued upload is done; strict: raise the first failure."""
        with self._lock:
            pending, self._uploads = self._uploads, []
        for future in pending:
            with contextlib.suppress(Exception):  # _upload_quietly reports its own
                future.result()
        error, self._upload_error = self._upload_error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Finish the uploads under way (a process that exits must not lose them)."""
        with self._lock:
            self._closed = True
            uploader = self._uploader
        try:
            self.wait_for_uploads()
        finally:
            if uploader is not None:
                uploader.shutdown(wait=True)

    # -- whole ladders, on request ----------------------------------------------------------

    def push(self, key: BlobKey) -> Transfer:
        """Upload the local blob of ``key``, checked against its local checksum."""
        short = key.hex[:12]
        try:
            entry = self.store.get_row(key.hex)
        except (ValueError, *INDEX_ERRORS) as exc:  # type: ignore[misc]
            raise StoreError(f"blob store {self.store.root}: cannot read {short} ({exc})") from exc
        if entry is None or entry.components != key.components:
            return Transfer(key.hex, TransferStatus.MISSING, note="not in the local store")
        if self._down is not None:
            return Transfer(key.hex, TransferStatus.UNAVAILABLE, note=self._down)
        try:
            metadata = {k: v for k, v in entry.metadata.items() if k not in (FETCHED_FROM, FETCH_S)}
            return self._upload(key, entry.path, entry.checksum, entry.compile_s, metadata)
        except RemoteUnavailableError as exc:
            self._down = str(exc)
            self._count(counters.STAT_REMOTE_FAILURES)
            return Transfer(key.hex, TransferStatus.UNAVAILABLE, note=str(exc))
        except ValueError as exc:
            return Transfer(
                key.hex,
                TransferStatus.REFUSED,
                note=f"{exc}; run `ovspec cache check --fix`",
            )
        except OSError as exc:
            return Transfer(key.hex, TransferStatus.MISSING, note=f"payload unreadable ({exc})")

    def pull(self, key: BlobKey, validate: Validator | None) -> Transfer:
        """Fetch ``key`` into the local store unless it is there; never compiles."""
        self.store.require_writable("pull blobs into it")
        if self.store.peek(key):
            return Transfer(key.hex, TransferStatus.LOCAL)
        errors: list[RemoteError] = []
        fetched: list[_Fetched] = []

        def obtain(path: Path) -> ProducedBlob:
            got = self._fetch_into(key, path, validate, errors)
            if got is None:
                raise _NotFetched
            fetched.append(got)
            return got.produced

        try:
            outcome = self.store.get_or_create_local(key, obtain, validate=None, map_payload=False)
        except _NotFetched:
            if not errors:
                return Transfer(key.hex, TransferStatus.MISSING, note="not on the remote")
            error = errors[0]
            if isinstance(error, RemoteUnavailableError):
                return Transfer(key.hex, TransferStatus.UNAVAILABLE, note=str(error))
            self._count(counters.STAT_REMOTE_REFUSED)
            return Transfer(key.hex, TransferStatus.REFUSED, note=str(error))
        if not fetched:
            return Transfer(key.hex, TransferStatus.LOCAL)  # another process stored it first
        return Transfer(key.hex, TransferStatus.PULLED, outcome.size_bytes, fetched[-1].seconds)
