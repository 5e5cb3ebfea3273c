"""A real S3 server for the remote tier's tests: one SeaweedFS per session (the
``seaweed`` fixture in conftest.py), a fresh prefix per test, remotes on it."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any

from ovspec.store.manifest import SigningKeys
from ovspec.store.remote import Remote
from ovspec.store.s3 import S3Backend, S3Settings
from ovspec.testing.seaweed import ADMIN, READER, SeaweedServer

BUCKET = "ovspec-test"
TEAM_KEY = SigningKeys({"team": b"team-secret-of-32-bytes-long-ok!"})
OTHER_KEY = SigningKeys({"team": b"another-secret-32-bytes-long-ok!"})


def new_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def settings_for(
    server: SeaweedServer, prefix: str, *, reader: bool = False, **overrides: Any
) -> S3Settings:
    identity = READER if reader else ADMIN
    return S3Settings(
        bucket=BUCKET,
        prefix=prefix,
        endpoint=server.endpoint,
        access_key_id=identity.access_key,
        secret_access_key=identity.secret_key,
        **overrides,
    )


def remote_for(
    server: SeaweedServer,
    prefix: str,
    *,
    keys: SigningKeys | None = None,
    read_only: bool = False,
    reader: bool = False,
    **overrides: Any,
) -> Remote:
    settings = settings_for(server, prefix, reader=reader, **overrides)
    return Remote(S3Backend(settings, read_only=read_only), keys=keys)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def down_remote(prefix: str = "down") -> Remote:
    settings = S3Settings(
        bucket=BUCKET,
        prefix=prefix,
        endpoint=f"http://127.0.0.1:{closed_port()}",
        access_key_id="nobody",
        secret_access_key="nothing",
    )
    return Remote(S3Backend(settings))


def write_payload(path: Path, size_bytes: int) -> Path:
    """``size_bytes`` of cheap, incompressible-enough bytes (a random 64 KiB block repeated)."""
    block = os.urandom(64 << 10)
    with path.open("wb") as f:
        left = size_bytes
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
    return path
