"""A shared remote that no client trusts: its configuration (``RemoteConfig``), the bytes
interface a backend implements (``RemoteBackend``) and ``Remote``, the ``BlobStorage``
level that checks every manifest and payload a backend returns.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO, Protocol

import xxhash

from ovspec.errors import (
    RemoteIntegrityError,
    RemoteReadOnlyError,
    StoreError,
    arg,
)
from ovspec.store.keys import BlobKey
from ovspec.store.manifest import Manifest, SigningKeys, describe_payload, new_manifest
from ovspec.store.records import BlobRecord, PayloadWriteError, Verdict
from ovspec.store.storage import PutResult
from ovspec.store.urls import has_user_info, redact

ENV_REMOTE = "OVSPEC_REMOTE"
ENV_READ_ONLY = "OVSPEC_REMOTE_READ_ONLY"
ENV_KEY_FILE = "OVSPEC_REMOTE_KEY_FILE"
_TRUE = ("1", "true", "yes", "on")


class RemoteBackend(Protocol):
    """Bytes in and out of one remote; ``Remote`` makes every trust decision."""

    read_only: bool

    @property
    def description(self) -> str: ...

    def read_manifest(self, hex_: str) -> bytes | None: ...

    def has_manifest(self, hex_: str) -> bool: ...

    def open_payload(self, sha256: str) -> tuple[int, Iterator[bytes]] | None: ...

    def list_manifests(self) -> Iterator[str]: ...

    def delete_manifest(self, hex_: str) -> bool: ...

    def write_payload(self, sha256: str, size_bytes: int, file: BinaryIO) -> bool: ...

    def create_manifest(self, hex_: str, data: bytes) -> bool: ...


@dataclass(frozen=True)
class RemoteConfig:
    """What ``--remote`` and its options (or ``OVSPEC_REMOTE*``) ask for."""

    url: str
    read_only: bool = False
    key_file: Path | None = None

    def __post_init__(self) -> None:
        scheme, sep, rest = self.url.partition("://")
        bucket = rest.split("/", 1)[0]
        if has_user_info(self.url):
            raise StoreError(
                f"remote {redact(self.url)!r} carries credentials in the URL; give them as "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile in ~/.aws) instead"
            )
        if scheme != "s3" or not sep or len(bucket) < 3:
            raise StoreError(
                f"remote {redact(self.url)!r} is not s3://BUCKET[/PREFIX]; check "
                f"{arg('remote', 's3://team-cache/ovspec')}"
            )

    @property
    def bucket(self) -> str:
        return self.url.partition("://")[2].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        parts = self.url.partition("://")[2].split("/", 1)
        return parts[1].strip("/") if len(parts) > 1 else ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RemoteConfig | None:
        env = os.environ if environ is None else environ
        url = env.get(ENV_REMOTE, "").strip()
        if not url:
            return None
        key_file = env.get(ENV_KEY_FILE, "").strip()
        return cls(
            url,
            read_only=env.get(ENV_READ_ONLY, "").strip().lower() in _TRUE,
            key_file=Path(key_file).expanduser() if key_file else None,
        )


class PublishOutcome(Enum):
    PUBLISHED = "published"  # our manifest is the one readers see
    ALREADY_PUBLISHED = "already_published"  # another writer's was there first


@dataclass(frozen=True)
class Published:
    outcome: PublishOutcome
    uploaded_bytes: int  # payload bytes sent (0: the payload or the manifest was there)


class Remote:
    """A remote whose every answer is checked. A manifest must name the key asked for;
    a payload must be exactly what its manifest says (size, sha256, xxh3-128) or nothing
    of it is kept. ``keys`` None: unsigned and signed manifests are accepted; with keys,
    only manifests one of them signed, and what this client publishes is signed.

    Publishing writes the payload first, under its sha256, and the manifest last, only
    if none is there: a reader never meets a partial blob, and no writer clobbers
    another. No key locks: two machines may compile one key; the first manifest wins.
    """

    def __init__(
        self, backend: RemoteBackend, *, keys: SigningKeys | None = None, url: str = ""
    ) -> None:
        self.backend = backend
        self.keys = keys
        self.url = url or backend.description
        self._manifests: dict[str, Manifest] = {}  # verified ones; manifests never change
        self._lock = threading.Lock()

    @property
    def read_only(self) -> bool:
        return self.backend.read_only

    @property
    def description(self) -> str:
        return self.backend.description

    def manifest(self, key: BlobKey) -> Manifest | None:
        """The verified manifest of ``key``; None if the remote has none."""
        with self._lock:
            known = self._manifests.get(key.hex)
        if known is not None:
            return known
        data = self.backend.read_manifest(key.hex)
        if data is None:
            return None
        manifest = Manifest.from_bytes(data)
        manifest.check_names(key)
        if self.keys is not None:
            self.keys.verify(manifest)
        with self._lock:
            self._manifests[key.hex] = manifest
        return manifest

    @property
    def location(self) -> str:
        return self.url

    def record(self, key: BlobKey) -> BlobRecord | None:
        """What the verified manifest of ``key`` says; None if the remote has none."""
        manifest = self.manifest(key)
        return manifest.record() if manifest is not None else None

    def contains(self, key: BlobKey) -> bool:
        """Whether a manifest for ``key`` is there (not read, not verified: a hint)."""
        with self._lock:
            if key.hex in self._manifests:
                return True
        return self.backend.has_manifest(key.hex)

    def fetch(self, key: BlobKey, dest: Path, *, max_bytes: int | None = None) -> Manifest | None:
        """Write the payload of ``key`` to ``dest`` and return its manifest; None if the
        remote has no manifest. Raises ``RemoteIntegrityError`` when the payload is not
        what the manifest says, or is larger than ``max_bytes``, and ``PayloadWriteError``
        when ``dest`` cannot hold it (its filesystem has less room than the manifest
        says, or a write fails): a local storage failure the store fails open on. Either
        way ``dest`` is gone: nothing unverified or short is kept.

        The download is bounded before it starts (the manifest's size against
        ``max_bytes`` and the free space under ``dest``) and while it runs (never more
        than the manifest's size): an unsigned manifest cannot make it fill a disk."""
        manifest = self.manifest(key)
        if manifest is None:
            return None
        ref, short = manifest.payload, key.hex[:12]
        if max_bytes is not None and ref.size_bytes > max_bytes:
            raise RemoteIntegrityError(
                f"the payload of {short} is {ref.size_bytes} bytes, over the {max_bytes} allowed"
            )
        _require_room(dest, ref.size_bytes, short)
        ok = False
        try:
            opened = self.backend.open_payload(ref.sha256)
            if opened is None:
                raise RemoteIntegrityError(
                    f"manifest {short} names payload {ref.sha256[:12]}, which the remote lacks"
                )
            announced, chunks = opened
            if announced != ref.size_bytes:
                raise RemoteIntegrityError(
                    f"the payload of {short} is {announced} bytes; its manifest says "
                    f"{ref.size_bytes}"
                )
            sha, xx, got = hashlib.sha256(), xxhash.xxh3_128(), 0
            with _local_writes(dest, short), dest.open("wb") as f:
                for chunk in chunks:
                    got += len(chunk)
                    if got > ref.size_bytes:
                        raise RemoteIntegrityError(
                            f"the server sent more than the {ref.size_bytes} bytes of {short}"
                        )
                    sha.update(chunk)
                    xx.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if got != ref.size_bytes or sha.hexdigest() != ref.sha256:
                raise RemoteIntegrityError(
                    f"the payload of {short} failed verification: {got} bytes with sha256 "
                    f"{sha.hexdigest()[:12]}, its manifest says {ref.size_bytes} bytes with "
                    f"{ref.sha256[:12]}"
                )
            if xx.hexdigest() != ref.xxh3_128:
                raise RemoteIntegrityError(f"manifest {short} records a wrong xxh3-128 checksum")
            ok = True
        finally:
            if not ok:
                with contextlib.suppress(FileNotFoundError):
                    dest.unlink()
        return manifest

    def publish(
        self,
        key: BlobKey,
        file: BinaryIO,
        compile_s: float,
        metadata: Mapping[str, str],
        *,
        expected_xxh3: str | None = None,
    ) -> Published:
        """Upload the payload in ``file`` (read from its start) and its manifest.

        ``expected_xxh3``: the local store's checksum of the payload; a file that does
        not hash to it is not uploaded (``ValueError``): only what the local store
        verified leaves the machine.
        """
        if self.read_only:
            raise RemoteReadOnlyError(f"the remote {self.url} is read-only here")
        if self.backend.has_manifest(key.hex):
            return Published(PublishOutcome.ALREADY_PUBLISHED, 0)  # before hashing anything
        ref = describe_payload(file)
        if expected_xxh3 is not None and ref.xxh3_128 != expected_xxh3:
            raise ValueError(f"blob {key.hex[:12]} changed on disk; not uploading it")
        manifest = new_manifest(key, ref, compile_s, metadata)
        if self.keys is not None:
            manifest = self.keys.sign(manifest)
        uploaded = self.backend.write_payload(ref.sha256, ref.size_bytes, file)
        created = self.backend.create_manifest(key.hex, manifest.to_bytes())
        if created:
            with self._lock:
                self._manifests[key.hex] = manifest
        return Published(
            PublishOutcome.PUBLISHED if created else PublishOutcome.ALREADY_PUBLISHED,
            ref.size_bytes if uploaded else 0,
        )

    def get(self, key: BlobKey, dest: Path, *, max_bytes: int | None = None) -> BlobRecord | None:
        """``fetch`` as a ``BlobStorage`` read: a payload larger than ``max_bytes`` (as its
        manifest says) is refused before a byte of it is downloaded."""
        fetched = self.fetch(key, dest, max_bytes=max_bytes)
        return fetched.record() if fetched is not None else None

    def put(self, key: BlobKey, source: Path, record: BlobRecord) -> PutResult:
        """``publish`` the file at ``source`` as ``record`` says (the file opened now is
        the one hashed and sent, whatever later replaces the name)."""
        if record.hex != key.hex or record.components != key.components:
            raise ValueError(f"the record names blob {record.hex[:12]}, not {key.hex[:12]}")
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        with open(fd, "rb") as file:
            published = self.publish(
                key, file, record.compile_s, record.metadata, expected_xxh3=record.checksum
            )
        return PutResult(published.outcome is PublishOutcome.PUBLISHED, published.uploaded_bytes)

    def remove(self, hex_: str) -> bool:
        """Delete the manifest of ``hex_`` (its payload, named by content, may serve
        other manifests and stays); whether there was one."""
        if self.read_only:
            raise RemoteReadOnlyError(f"the remote {self.url} is read-only here")
        with self._lock:
            self._manifests.pop(hex_, None)
        return self.backend.delete_manifest(hex_)

    def hexes(self) -> Iterator[str]:
        return self.backend.list_manifests()

    def verify(self, key: BlobKey) -> Verdict:
        """Download the payload of ``key`` to a temp file and check it against its
        manifest; nothing on the remote changes (it is not this client's to repair)."""
        with tempfile.TemporaryDirectory(prefix="ovspec-verify-") as folder:
            try:
                found = self.fetch(key, Path(folder) / "payload")
            except RemoteIntegrityError:
                return Verdict.CORRUPT
            except PayloadWriteError as exc:
                raise StoreError(f"cannot verify {key.hex[:12]} of {self.url}: {exc}") from exc
        return Verdict.OK if found is not None else Verdict.MISSING


# Room left on the filesystem after a download: a payload that would leave less is not
# fetched (the index, sidecars and the model's own files need some).
_FREE_MARGIN_BYTES = 1 << 20


def _require_room(dest: Path, size_bytes: int, short: str) -> None:
    """Refuse, before a byte is downloaded, a payload the filesystem of ``dest`` cannot
    hold (with a margin): without this an unsigned manifest naming a huge payload fills
    the disk before the size check at its end."""
    try:
        st = os.statvfs(dest.parent)
    except OSError as exc:
        raise PayloadWriteError(
            exc.errno or errno.EIO, f"cannot write the payload of {short} ({exc.strerror})"
        ) from exc
    free = st.f_bavail * st.f_frsize
    if size_bytes + _FREE_MARGIN_BYTES > free:
        raise PayloadWriteError(
            errno.ENOSPC,
            f"the payload of {short} is {size_bytes} bytes and {dest.parent} has {free} "
            "bytes free; not downloading it",
        )


@contextlib.contextmanager
def _local_writes(dest: Path, short: str) -> Iterator[None]:
    """The download's own writes failing (disk full, a file size limit, EIO) as
    ``PayloadWriteError``: a failure of local storage, which the store fails open on,
    not of the remote (whose errors are ``StoreError``s)."""
    try:
        yield
    except PayloadWriteError:
        raise
    except OSError as exc:  # the transport's errors arrive as RemoteUnavailableError
        raise PayloadWriteError(
            exc.errno or errno.EIO,
            f"cannot write the payload of {short} here ({exc.strerror or exc})",
            str(dest),
        ) from exc


def open_remote(
    config: RemoteConfig,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Remote:
    """A ``Remote`` on S3 for ``config``: endpoint, region and credentials from the AWS
    variables or files (``awsconfig``), the signing keys from ``config.key_file``.
    Nothing is contacted yet. Needs obstore (``pip install 'ovspec[remote]'``)."""
    from ovspec.store import awsconfig

    try:
        from ovspec.store.s3 import S3Backend, S3Settings
    except ImportError as exc:
        raise StoreError(
            f"the remote tier needs obstore ({exc}); install it with `pip install 'ovspec[remote]'`"
        ) from None
    keys = SigningKeys.load(config.key_file) if config.key_file is not None else None
    aws = awsconfig.resolve(environ, home)
    settings = S3Settings(
        bucket=config.bucket,
        prefix=config.prefix,
        endpoint=aws.endpoint,
        region=aws.region,
        access_key_id=aws.access_key_id,
        secret_access_key=aws.secret_access_key,
        session_token=aws.session_token,
    )
    return Remote(S3Backend(settings, read_only=config.read_only), keys=keys, url=config.url)
