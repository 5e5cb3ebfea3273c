"""The remote's record of one blob and what makes it trustworthy: the manifest (format,
parsing that trusts no unchecked field, canonical JSON), the payload's description (size,
sha256, xxh3-128 in one pass) and HMAC-SHA256 signing with rotating key ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from ovspec.errors import RemoteIntegrityError, RemoteSignatureError, StoreError, arg
from ovspec.store.keys import BlobKey, KeyComponent
from ovspec.store.records import BlobRecord

# History: 1 — first format (2026-12).
REMOTE_FORMAT = "ovspec-remote 1"
MAX_MANIFEST_BYTES = 1 << 20  # an untrusted server must not make a client read a huge one
HMAC_ALG = "hmac-sha256"
# Domain separation: a MAC made with a team key means "this is an ovspec manifest", so a
# key shared with another tool cannot be used to forge one (or the reverse).
_MAC_DOMAIN = b"ovspec-remote-manifest\x00"
MIN_SECRET_BYTES = 16
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_CHUNK_BYTES = 8 << 20


def canonical_json(obj: Any) -> bytes:
    """One byte string per value: sorted keys, no whitespace, UTF-8, no NaN or infinity.

    Manifests hold only strings, integers, lists and objects (no floats), so any
    language that sorts keys and escapes the same way signs the same bytes.
    """
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is {value!r}, not an integer >= 0")
    return value


@dataclass(frozen=True)
class PayloadRef:
    """What the payload must be. The remote names it by sha256, a cryptographic hash:
    a signature over xxh3 alone would not stop a payload forged to the same xxh3."""

    size_bytes: int
    sha256: str
    xxh3_128: str  # the local store's checksum, checked again when the payload is stored

    def __post_init__(self) -> None:
        _int(self.size_bytes, "payload size_bytes")
        if not _HEX64.fullmatch(self.sha256):
            raise ValueError(f"payload sha256 {self.sha256!r} is not 64 lowercase hex digits")
        if not _HEX32.fullmatch(self.xxh3_128):
            raise ValueError(f"payload xxh3_128 {self.xxh3_128!r} is not 32 lowercase hex digits")

    def to_json(self) -> dict[str, object]:
        return {"size_bytes": self.size_bytes, "sha256": self.sha256, "xxh3_128": self.xxh3_128}


@dataclass(frozen=True)
class Signature:
    key_id: str
    mac: str
    alg: str = HMAC_ALG


@dataclass(frozen=True)
class Manifest:
    """The remote's record of one blob: its key, its payload, what it cost to compile."""

    hex: str
    components: tuple[KeyComponent, ...]
    payload: PayloadRef
    compile_us: int  # integer microseconds: canonical JSON carries no floats
    created_unix_s: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    signature: Signature | None = None

    def __post_init__(self) -> None:
        if not _HEX32.fullmatch(self.hex):
            raise ValueError(f"manifest hex {self.hex!r} is not 32 lowercase hex digits")
        _int(self.compile_us, "manifest compile_us")
        _int(self.created_unix_s, "manifest created_unix_s")
        for k, v in self.metadata.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise ValueError(f"manifest metadata must map str to str, got {k!r}: {v!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def compile_s(self) -> float:
        return self.compile_us / 1e6

    def record(self) -> BlobRecord:
        """What the manifest says of its blob, as every level of the store says it."""
        return BlobRecord(
            hex=self.hex,
            components=self.components,
            size_bytes=self.payload.size_bytes,
            checksum=self.payload.xxh3_128,
            compile_s=self.compile_s,
            metadata=dict(self.metadata),
        )

    def body(self) -> dict[str, Any]:
        """Everything the signature covers: the whole manifest but the signature."""
        return {
            "format": REMOTE_FORMAT,
            "hex": self.hex,
            "components": [[c.name, c.value] for c in self.components],
            "payload": self.payload.to_json(),
            "compile_us": self.compile_us,
            "created_unix_s": self.created_unix_s,
            "metadata": dict(self.metadata),
        }

    def to_json(self) -> dict[str, Any]:
        obj = self.body()
        if self.signature is not None:
            obj["signature"] = {
                "alg": self.signature.alg,
                "key_id": self.signature.key_id,
                "mac": self.signature.mac,
            }
        return obj

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse what a server sent; ``RemoteIntegrityError`` for anything malformed."""
        try:
            return cls.from_json(json.loads(data))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise RemoteIntegrityError(f"malformed manifest ({exc})") from exc

    @classmethod
    def from_json(cls, obj: object) -> Manifest:
        """Parse a decoded manifest; ValueError naming the first bad field."""
        if not isinstance(obj, dict):
            raise ValueError(f"it is a {type(obj).__name__}, not an object")
        if obj.get("format") != REMOTE_FORMAT:
            raise ValueError(f"format is {obj.get('format')!r}, not {REMOTE_FORMAT!r}")
        components = obj.get("components")
        if not isinstance(components, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
            for c in components
        ):
            raise ValueError("'components' is not a list of [name, value] strings")
        payload = obj.get("payload")
        if not isinstance(payload, dict):
            raise ValueError("'payload' is not an object")
        metadata = obj.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' is not an object")
        raw_sig = obj.get("signature")
        signature = None
        if raw_sig is not None:
            if not isinstance(raw_sig, dict) or not all(
                isinstance(raw_sig.get(k), str) for k in ("alg", "key_id", "mac")
            ):
                raise ValueError("'signature' is not an object of alg, key_id and mac strings")
            signature = Signature(raw_sig["key_id"], raw_sig["mac"], raw_sig["alg"])
        hex_ = obj.get("hex")
        if not isinstance(hex_, str):
            raise ValueError("'hex' is not a string")
        return cls(
            hex=hex_,
            components=tuple(KeyComponent(n, v) for n, v in components),
            payload=PayloadRef(
                _int(payload.get("size_bytes"), "payload size_bytes"),
                str(payload.get("sha256")),
                str(payload.get("xxh3_128")),
            ),
            compile_us=_int(obj.get("compile_us"), "compile_us"),
            created_unix_s=_int(obj.get("created_unix_s"), "created_unix_s"),
            metadata=metadata,
            signature=signature,
        )

    def check_names(self, key: BlobKey) -> None:
        """Refuse a manifest that does not describe ``key``: a (validly signed) manifest
        copied under another key's name, or components that do not hash to its hex."""
        short = key.hex[:12]
        if self.hex != key.hex or self.components != key.components:
            raise RemoteIntegrityError(
                f"the manifest stored as {short} describes another key ({self.hex[:12]})"
            )
        try:
            recomputed = BlobKey(self.components).hex
        except ValueError as exc:
            raise RemoteIntegrityError(f"manifest {short} has malformed components") from exc
        if recomputed != key.hex:
            raise RemoteIntegrityError(f"manifest {short}: its components hash to another key")


def describe_payload(file: BinaryIO) -> PayloadRef:
    """Size, sha256 and xxh3-128 of an open file from its start, in one streamed pass."""
    sha, xx, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    file.seek(0)
    while chunk := file.read(_CHUNK_BYTES):
        sha.update(chunk)
        xx.update(chunk)
        size += len(chunk)
    return PayloadRef(size, sha.hexdigest(), xx.hexdigest())


def new_manifest(
    key: BlobKey, payload: PayloadRef, compile_s: float, metadata: Mapping[str, str]
) -> Manifest:
    if not (math.isfinite(compile_s) and compile_s >= 0):
        raise ValueError(f"compile_s must be a finite number >= 0, got {compile_s!r}")
    return Manifest(
        hex=key.hex,
        components=key.components,
        payload=payload,
        compile_us=round(compile_s * 1e6),
        created_unix_s=int(time.time()),
        metadata=dict(metadata),
    )


class SigningKeys:
    """HMAC-SHA256 over the canonical JSON of a manifest's body, under named keys.

    ``keys`` maps a key id to its secret; the first (or ``signing_key_id``) signs new
    manifests, every one verifies, so a team rotates by adding the new key everywhere,
    then making it the signing one, then dropping the old. A client holding keys refuses
    unsigned manifests, unknown key ids, other algorithms and bad MACs.
    """

    def __init__(self, keys: Mapping[str, bytes], signing_key_id: str | None = None) -> None:
        if not keys:
            raise ValueError("signing needs at least one key")
        for key_id, secret in keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(f"key id {key_id!r} must be 1-64 of A-Z a-z 0-9 . _ -")
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(
                    f"key {key_id!r} is {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
                    "random bytes (32 recommended)"
                )
        self._keys = dict(keys)
        self.signing_key_id = signing_key_id if signing_key_id is not None else next(iter(keys))
        if self.signing_key_id not in self._keys:
            raise ValueError(f"signing key id {self.signing_key_id!r} is not among the keys")

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def _mac(self, key_id: str, manifest: Manifest) -> str:
        message = _MAC_DOMAIN + canonical_json(manifest.body())
        return hmac.new(self._keys[key_id], message, hashlib.sha256).hexdigest()

    def sign(self, manifest: Manifest) -> Manifest:
        mac = self._mac(self.signing_key_id, manifest)
        return dataclasses.replace(manifest, signature=Signature(self.signing_key_id, mac))

    def verify(self, manifest: Manifest) -> None:
        """Raises ``RemoteSignatureError`` unless one of our keys signed exactly this body."""
        sig, short = manifest.signature, manifest.hex[:12]
        if sig is None:
            raise RemoteSignatureError(
                f"manifest {short} is unsigned, and this client requires signed manifests"
            )
        if sig.alg != HMAC_ALG:
            raise RemoteSignatureError(f"manifest {short} is signed with {sig.alg!r}, not hmac")
        if sig.key_id not in self._keys:
            raise RemoteSignatureError(f"manifest {short} is signed by unknown key {sig.key_id!r}")
        if not hmac.compare_digest(sig.mac, self._mac(sig.key_id, manifest)):
            raise RemoteSignatureError(
                f"manifest {short}: the signature does not match (altered, or another secret "
                f"under key id {sig.key_id!r})"
            )

    @classmethod
    def parse(cls, text: str, source: str) -> SigningKeys:
        """``KEY_ID:HEX_SECRET`` lines (``#`` comments); the first key signs."""
        keys: dict[str, bytes] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            key_id, sep, secret_hex = line.partition(":")
            try:
                if not sep:
                    raise ValueError("expected KEY_ID:HEX_SECRET")
                secret = bytes.fromhex(secret_hex.strip())
            except ValueError as exc:
                raise StoreError(f"{source} line {number}: {exc} (KEY_ID:HEX_SECRET)") from None
            if key_id.strip() in keys:
                raise StoreError(f"{source} line {number}: key id {key_id.strip()!r} twice")
            keys[key_id.strip()] = secret
        try:
            return cls(keys)
        except ValueError as exc:
            raise StoreError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> SigningKeys:
        """Read a key file; it must be a regular file only its owner can read or write:
        anyone who can read the secret can sign, anyone who can write it can swap it.
        O_NONBLOCK: a FIFO there would block the open until a writer came (issue 29)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise StoreError(
                f"cannot read the signing key file {path} ({exc.strerror}); check "
                f"{arg('remote_key_file')}"
            ) from None
        with open(fd, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"the signing key file {path} is not a regular file")
            if st.st_mode & 0o077:
                raise StoreError(
                    f"the signing key file {path} can be read or written by others "
                    f"(mode {stat.S_IMODE(st.st_mode):o}); `chmod 600 {path}`"
                )
            return cls.parse(f.read(1 << 16), str(path))
