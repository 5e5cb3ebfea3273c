"""Two levels composed: the local store in front, a remote (any ``BlobStorage``) behind.
A local miss asks the remote before the producer; a blob compiled here is uploaded in
the background; the remote never fails a build. Only the front's public calls are used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath, PureWindowsPath

from ovspec.errors import (
    RemoteIntegrityError,
    RemoteUnavailableError,
    StoreError,
)
from ovspec.store import index as counters
from ovspec.store.disk import DiskStore
from ovspec.store.files import unlink
from ovspec.store.keys import BlobKey
from ovspec.store.records import (
    BlobOutcome,
    BlobRecord,
    PayloadWriteError,
    ProducedBlob,
    StoreWarning,
)
from ovspec.store.storage import BlobStorage
from ovspec.store.urls import redact

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
    NO_ROOM = "no_room"  # pull: the local store cannot hold it (disk full, a size limit)
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


def _shareable(metadata: Mapping[str, str]) -> dict[str, str]:
    """Metadata to upload: what the producer noted, not what a fetch added here, and no
    local path: every reader of the bucket would learn the uploader's folders (and user
    name); a path becomes its last component (the model folder's name), which is all a
    reader shows."""
    return {k: _anonymous(v) for k, v in metadata.items() if k not in (FETCHED_FROM, FETCH_S)}


def _anonymous(value: str) -> str:
    """An absolute path (POSIX or Windows) as its last component; anything else as is."""
    for flavour in (PurePosixPath, PureWindowsPath):
        path = flavour(value)
        if path.is_absolute():
            return path.name
    return value


class Tier:
    """A local store (``front``) with a remote level behind it.

    Under the front's key lock, a local miss asks the remote before the producer: its
    payload is verified by the remote (``get``), proven importable (``validate``) and
    committed by the front with the checksum the remote's record names. A blob compiled
    here is uploaded on a background thread once committed and unlocked. Each remote
    failure is one ``RemoteWarning`` and a compile (``strict``: raised instead); a
    remote found unreachable is not asked again. Counts go to the front's counters.
    """

    def __init__(self, front: DiskStore, remote: BlobStorage, *, strict: bool = False) -> None:
        self.front = front
        self.remote = remote
        self.strict = strict
        self._lock = threading.Lock()
        self._down: str | None = None  # why the remote is not asked any more
        self._warned: set[str] = set()
        self._uploader: ThreadPoolExecutor | None = None
        self._uploads: list[Future[None]] = []
        self._upload_error: StoreError | None = None
        self._closed = False
        # This process's uploads (the front's counters count every process's).
        self.uploaded = 0
        self.uploaded_bytes = 0

    @property
    def down(self) -> str | None:
        return self._down

    @property
    def location(self) -> str:
        """Where the remote is (its URL)."""
        return self.remote.location

    # -- failing open ---------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        message = redact(" ".join(message.split()))  # an endpoint's credentials stay out
        with self._lock:
            if message in self._warned:
                return
            self._warned.add(message)
        log.debug("%s", message)
        warnings.warn(message, RemoteWarning, stacklevel=4)

    def _failed(self, what: str, exc: StoreError) -> None:
        """A remote failure: counted, then raised when strict, else one warning."""
        if isinstance(exc, RemoteUnavailableError):
            with self._lock:
                first = self._down is None
                self._down = str(exc)
            if first:
                self.front.count(counters.STAT_REMOTE_FAILURES)
            if self.strict:
                raise exc
            self._warn(
                f"remote {self.location}: {exc}; {what} locally, and not asking the remote "
                "again in this process"
            )
            return
        self.front.count(counters.STAT_REMOTE_REFUSED)
        if self.strict:
            raise exc
        self._warn(f"remote {self.location}: {exc}; {what} locally")

    # -- reads ----------------------------------------------------------------------------

    def get_or_create(
        self,
        key: BlobKey,
        produce: Producer,
        validate: Validator | None,
        map_payload: bool,
    ) -> BlobOutcome:
        """``get_or_create`` with the remote between the local store and ``produce``."""
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

        outcome = self.front.get_or_create(key, obtain, validate=check, map_payload=map_payload)
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
        errors: list[StoreError] | None = None,
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
            # Bounded by the local size limit (a payload over it could not be kept) and,
            # inside ``get``, by the free space under ``path``.
            record = self.remote.get(key, path, max_bytes=self.front.size_limit_bytes)
        except StoreError as exc:
            if errors is None:
                self._failed(f"compiling {short}", exc)
            else:
                errors.append(exc)
                if isinstance(exc, RemoteUnavailableError):
                    self._down = str(exc)
            return None
        if record is None:
            self.front.count(counters.STAT_REMOTE_MISSES)
            return None
        fetch_s = time.perf_counter() - began
        if validate is not None:
            try:
                validate(path)
            except Exception as exc:  # the device's verdict, whatever its exception type
                unlink(path)
                refused = RemoteIntegrityError(
                    f"blob {short} verifies against its manifest but is not usable here ({exc})"
                )
                if errors is None:
                    self._failed(f"compiling {short}", refused)
                else:
                    errors.append(refused)
                return None
        size = record.size_bytes
        self.front.count(counters.STAT_REMOTE_HITS)
        self.front.count(counters.STAT_REMOTE_FETCHED_BYTES, size)
        self.front.count(counters.STAT_REMOTE_FETCH_US, round(fetch_s * 1e6))
        self.front.count(counters.STAT_REMOTE_SAVED_US, round(record.compile_s * 1e6))
        metadata = {
            **record.metadata,
            FETCHED_FROM: self.location,
            FETCH_S: f"{fetch_s:.6f}",
        }
        produced = ProducedBlob(
            compile_s=record.compile_s,
            metadata=metadata,
            size_bytes=size,
            checksum=record.checksum,
        )
        return _Fetched(produced, fetch_s)

    def contains(self, key: BlobKey) -> bool:
        """Whether the remote names ``key`` (a hint: nothing is verified); False if down."""
        if self._down is not None:
            return False
        try:
            return self.remote.contains(key)
        except StoreError as exc:
            self._failed("working", exc)
            return False

    def record(self, key: BlobKey) -> BlobRecord | None:
        """The remote's record of ``key`` (its compile time, payload size and metadata,
        from a verified manifest); None if absent, or failed (warned)."""
        if self._down is not None:
            return None
        try:
            record = self.remote.record(key)
        except StoreError as exc:
            self._failed("working", exc)
            return None
        if record is None:
            return None
        # Marked as the remote's (as a fetched entry's is): a reader can tell what a
        # bucket said from what this machine recorded.
        metadata = {**record.metadata, FETCHED_FROM: self.location}
        return dataclasses.replace(record, metadata=metadata)

    # -- uploads --------------------------------------------------------------------------

    def upload_later(self, key: BlobKey, outcome: BlobOutcome) -> None:
        """Queue the upload of a blob just committed; returns at once."""
        if self.remote.read_only or self._down is not None or outcome.checksum is None:
            return
        record = BlobRecord(
            hex=key.hex,
            components=key.components,
            size_bytes=outcome.size_bytes,
            checksum=outcome.checksum,
            compile_s=outcome.compile_s,
            metadata=_shareable(outcome.metadata),
        )
        with self._lock:
            if self._closed:
                return
            if self._uploader is None:
                self._uploader = ThreadPoolExecutor(1, thread_name_prefix="ovspec-upload")
            future = self._uploader.submit(self._upload_quietly, key, outcome.path, record)
            self._uploads.append(future)

    def _upload_quietly(self, key: BlobKey, path: Path, record: BlobRecord) -> None:
        if self._down is not None:
            return
        try:
            self._upload(key, path, record)
        except StoreError as exc:
            if self.strict:
                with self._lock:
                    self._upload_error = self._upload_error or exc
                return
            self._failed(f"kept blob {key.hex[:12]}", exc)
        except (OSError, ValueError) as exc:
            # Evicted, removed or changed since its commit: nothing verified to upload.
            log.debug("not uploading %s: %s", key.hex[:12], exc)
        except Exception as exc:  # a bug, or a client error of a kind not mapped yet
            self._warn(f"upload of blob {key.hex[:12]} to {self.location} failed ({exc!r})")

    def _upload(self, key: BlobKey, path: Path, record: BlobRecord) -> Transfer:
        began = time.perf_counter()
        put = self.remote.put(key, path, record)
        seconds = time.perf_counter() - began
        with self._lock:
            self.uploaded += put.stored
            self.uploaded_bytes += put.moved_bytes
        if put.stored:
            self.front.count(counters.STAT_REMOTE_UPLOADS)
        if put.moved_bytes:
            self.front.count(counters.STAT_REMOTE_UPLOADED_BYTES, put.moved_bytes)
            self.front.count(counters.STAT_REMOTE_UPLOAD_US, round(seconds * 1e6))
        status = TransferStatus.PUBLISHED if put.stored else TransferStatus.ON_REMOTE
        return Transfer(key.hex, status, put.moved_bytes, seconds)

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
        entry = self.front.record(key)
        if entry is None:
            return Transfer(key.hex, TransferStatus.MISSING, note="not in the local store")
        if self._down is not None:
            return Transfer(key.hex, TransferStatus.UNAVAILABLE, note=self._down)
        record = dataclasses.replace(entry, metadata=_shareable(entry.metadata))
        try:
            return self._upload(key, entry.path, record)
        except RemoteUnavailableError as exc:
            self._down = str(exc)
            self.front.count(counters.STAT_REMOTE_FAILURES)
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
        if self.front.read_only:
            raise StoreError(
                f"blob store {self.front.root} is read-only here; cannot pull blobs into it"
            )
        if self.front.contains(key):
            return Transfer(key.hex, TransferStatus.LOCAL)
        errors: list[StoreError] = []
        fetched: list[_Fetched] = []
        no_room: list[str] = []

        def obtain(path: Path) -> ProducedBlob:
            try:
                got = self._fetch_into(key, path, validate, errors)
            except PayloadWriteError as exc:  # the local disk, not the remote: no room
                no_room.append(str(exc))
                raise _NotFetched from exc
            if got is None:
                raise _NotFetched
            fetched.append(got)
            return got.produced

        try:
            outcome = self.front.get_or_create(key, obtain, validate=None, map_payload=False)
        except _NotFetched:
            if no_room:
                return Transfer(key.hex, TransferStatus.NO_ROOM, note=no_room[0])
            if not errors:
                return Transfer(key.hex, TransferStatus.MISSING, note="not on the remote")
            error = errors[0]
            if isinstance(error, RemoteUnavailableError):
                return Transfer(key.hex, TransferStatus.UNAVAILABLE, note=str(error))
            self.front.count(counters.STAT_REMOTE_REFUSED)
            return Transfer(key.hex, TransferStatus.REFUSED, note=str(error))
        if not fetched:
            return Transfer(key.hex, TransferStatus.LOCAL)  # another process stored it first
        return Transfer(key.hex, TransferStatus.PULLED, outcome.size_bytes, fetched[-1].seconds)
