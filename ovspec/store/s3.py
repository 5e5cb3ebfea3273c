"""The remote's one backend: an S3-compatible bucket through obstore; it moves bytes and
decides nothing (``remote.Remote`` does). Imported only when a remote is configured, so
obstore (the ``remote`` extra) is needed only then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, BinaryIO

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PermissionDeniedError
from obstore.store import S3Store

from ovspec.errors import RemoteIntegrityError, RemoteReadOnlyError, RemoteUnavailableError
from ovspec.store.manifest import MAX_MANIFEST_BYTES
from ovspec.store.urls import redact

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

LAYOUT = "v1"  # bump with the manifest format when the layout changes
_STREAM_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class S3Settings:
    """How to reach one bucket. Keys None: obstore's own chain (web identity, ECS,
    instance metadata) finds credentials, or none are sent."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    connect_timeout_s: float = 2.0
    # Manifests, HEADs and listings are small: a server that does not answer one in this
    # long is treated as down.
    metadata_timeout_s: float = 2.0
    # Payload transfers: per read, so a slow large blob goes on and a stalled one fails.
    read_timeout_s: float = 30.0
    # obstore's default, 10 retries with backoff, takes seconds to report a refused
    # connection; a cache must fail fast and compile instead.
    max_retries: int = 1
    multipart_chunk_bytes: int = 16 << 20
    multipart_concurrency: int = 4

    def __post_init__(self) -> None:
        if len(self.bucket) < 3 or "/" in self.bucket:
            raise ValueError(f"bucket name {self.bucket!r} must be 3 or more characters, no '/'")
        if self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError(f"prefix {self.prefix!r} must not start or end with '/'")
        if self.multipart_chunk_bytes < 5 << 20:
            raise ValueError("multipart chunks must be at least 5 MiB (the S3 minimum part)")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("an access key id needs its secret, and the reverse")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def _first_line(exc: BaseException) -> str:
    """The client's message, short, without a URL's credentials (an endpoint given as
    ``http://user:secret@host`` is echoed in every request error)."""
    return redact(str(exc).strip().split("\n", 1)[0])[:300]


@contextlib.contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """obstore's and the OS's errors as ``RemoteUnavailableError`` (a 404 a caller
    expects is caught before it gets here: obstore raises FileNotFoundError for it)."""
    try:
        yield
    except PermissionDeniedError as exc:
        raise RemoteUnavailableError(f"{what}: permission denied ({_first_line(exc)})") from exc
    except (BaseError, OSError, TimeoutError) as exc:
        raise RemoteUnavailableError(f"{what}: {_first_line(exc)}") from exc


class S3Backend:
    """One bucket, under ``<prefix>/v1/``: ``payloads/<sha256>`` (content-addressed, so
    any writer of a name writes the same bytes) and ``manifests/<key hex>.json``
    (written last, and only if absent)."""

    def __init__(self, settings: S3Settings, *, read_only: bool = False) -> None:
        self.settings = settings
        self.read_only = read_only
        s = settings
        config: S3Config = {"region": s.region}
        if s.endpoint is not None:
            config["endpoint"] = s.endpoint
        if s.access_key_id is not None and s.secret_access_key is not None:
            config["access_key_id"] = s.access_key_id
            config["secret_access_key"] = s.secret_access_key
            if s.session_token is not None:
                config["session_token"] = s.session_token
        client: ClientConfig = {
            "connect_timeout": timedelta(seconds=s.connect_timeout_s),
            "read_timeout": timedelta(seconds=s.read_timeout_s),
        }
        # Explicit client options replace those obstore would read from the environment
        # (AWS_ALLOW_HTTP among them), so plain http is decided here.
        if s.endpoint is not None and s.endpoint.startswith("http://"):
            client["allow_http"] = True
        small: ClientConfig = {**client, "timeout": timedelta(seconds=s.metadata_timeout_s)}
        retry: RetryConfig = {"max_retries": s.max_retries, "retry_timeout": timedelta(seconds=10)}
        root = "/".join(p for p in (s.prefix, LAYOUT) if p)
        # Two clients on one bucket: payloads (per-read timeout) and everything small (an
        # overall timeout), so a hung server costs seconds, not the payload timeout.
        with _unavailable(f"cannot configure the remote {s.url}"):
            self._data = S3Store(
                s.bucket, prefix=root, config=config, client_options=client, retry_config=retry
            )
            self._small = S3Store(
                s.bucket, prefix=root, config=config, client_options=small, retry_config=retry
            )

    @property
    def description(self) -> str:
        """The bucket and prefix as a URL (the endpoint is configuration, not identity)."""
        return self.settings.url

    @staticmethod
    def manifest_path(hex_: str) -> str:
        return f"manifests/{hex_}.json"

    @staticmethod
    def payload_path(sha256: str) -> str:
        return f"payloads/{sha256}"

    # -- reads --------------------------------------------------------------------------

    def read_manifest(self, hex_: str) -> bytes | None:
        with _unavailable(f"reading manifest {hex_[:12]} from {self.settings.url}"):
            try:
                result = obstore.get(self._small, self.manifest_path(hex_))
            except FileNotFoundError:
                return None
            size = result.meta["size"]
            if size > MAX_MANIFEST_BYTES:
                raise RemoteIntegrityError(f"manifest {hex_[:12]} is {size} bytes; not reading it")
            return bytes(result.bytes())

    def has_manifest(self, hex_: str) -> bool:
        with _unavailable(f"looking for manifest {hex_[:12]} on {self.settings.url}"):
            try:
                obstore.head(self._small, self.manifest_path(hex_))
            except FileNotFoundError:
                return False
            return True

    def open_payload(self, sha256: str) -> tuple[int, Iterator[bytes]] | None:
        """The size the server announces and the payload's bytes as they arrive; None if
        the server has no such payload. Transport errors while streaming are
        ``RemoteUnavailableError``."""
        what = f"downloading payload {sha256[:12]} from {self.settings.url}"
        with _unavailable(what):
            try:
                result = obstore.get(self._data, self.payload_path(sha256))
            except FileNotFoundError:
                return None
            size = int(result.meta["size"])
            stream = result.stream(min_chunk_size=_STREAM_CHUNK_BYTES)

        def chunks() -> Iterator[bytes]:
            with _unavailable(what):
                for chunk in stream:
                    yield bytes(chunk)

        return size, chunks()

    def list_manifests(self) -> Iterator[str]:
        with _unavailable(f"listing {self.settings.url}"):
            for batch in obstore.list(self._small, prefix="manifests/", chunk_size=1000):
                for meta in batch:
                    name = meta["path"].rsplit("/", 1)[-1]
                    if name.endswith(".json"):
                        yield name[: -len(".json")]

    # -- writes -------------------------------------------------------------------------

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            raise RemoteReadOnlyError(f"remote {self.settings.url} is read-only here; not {what}")

    def write_payload(self, sha256: str, size_bytes: int, file: BinaryIO) -> bool:
        """Upload unless a payload of that name and size is there; True if uploaded.

        Unconditional and multipart above one chunk: a payload's name is its content,
        so any writer of it writes the same bytes, and parts stay invisible until the
        upload completes (a killed uploader leaves nothing a reader can name).
        """
        self._require_writable(f"uploading payload {sha256[:12]}")
        path = self.payload_path(sha256)
        with _unavailable(f"uploading payload {sha256[:12]} to {self.settings.url}"):
            try:
                if obstore.head(self._small, path)["size"] == size_bytes:
                    return False
            except FileNotFoundError:
                pass
            file.seek(0)
            obstore.put(
                self._data,
                path,
                file,
                chunk_size=self.settings.multipart_chunk_bytes,
                max_concurrency=self.settings.multipart_concurrency,
            )
        return True

    def delete_manifest(self, hex_: str) -> bool:
        """Delete a manifest (its payload may serve others and stays); False if absent."""
        self._require_writable(f"deleting manifest {hex_[:12]}")
        with _unavailable(f"deleting manifest {hex_[:12]} on {self.settings.url}"):
            if not self.has_manifest(hex_):
                return False
            obstore.delete(self._small, self.manifest_path(hex_))
        return True

    def create_manifest(self, hex_: str, data: bytes) -> bool:
        """Write a manifest only if none is there (``If-None-Match: *``); False if one was.

        A single-part PUT: servers make a conditional single PUT atomic under contention,
        not all of them a conditional multipart completion, so manifests stay small.
        Through the payload client: a new bucket's first write can stall while the
        server grows volumes, and publishing is not urgent.
        """
        self._require_writable(f"publishing manifest {hex_[:12]}")
        with _unavailable(f"publishing manifest {hex_[:12]} on {self.settings.url}"):
            try:
                obstore.put(self._data, self.manifest_path(hex_), data, mode="create")
            except AlreadyExistsError:
                return False
        return True
