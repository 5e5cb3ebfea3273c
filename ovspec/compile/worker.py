"""One timed compile in a fresh process: ``python -m ovspec.compile.worker`` (JSON on stdin).

Owns the request/result wire format and what a run records: the compile's wall and
process CPU time, the exported blob's hash, and the environment that actually loaded
(libraries from /proc/self/maps with file hashes, OpenVINO and device versions, host).
Runs under an arm's interpreter, so it needs only openvino, numpy and xxhash there.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ovspec.compile.host import cpu_model
from ovspec.errors import BadRequestError, CompileError, DeviceError, ModelError, OvspecError

WORKER_MODULE = "ovspec.compile.worker"

# Bump when a field of the request or the result changes meaning.
# History: 1 — first format (2026-11).
WORKER_FORMAT_VERSION = 1

# Shared libraries whose identity is recorded: OpenVINO and its plugins, the NPU
# compiler, TBB (its scheduler runs the compile), and the Python binding.
LIBRARY_MARKERS = ("libopenvino", "npu", "tbb", "_pyopenvino")

_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class WorkerRequest:
    """What one worker compiles. ``blob_path`` is removed after hashing unless kept."""

    xml_path: str
    phase: str
    capacity_tokens: int
    chunk_tokens: int
    device: str
    properties: dict[str, str]
    blob_path: str
    keep_blob: bool = False
    format: int = WORKER_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format != WORKER_FORMAT_VERSION:
            raise BadRequestError(
                f"worker request format {self.format} is not {WORKER_FORMAT_VERSION}; the "
                "arm's ovspec differs from the harness's"
            )
        if any(k.upper() == "CACHE_DIR" for k in self.properties):
            raise BadRequestError("a timed compile must not set CACHE_DIR (it would be a load)")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerRequest:
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise BadRequestError(f"malformed worker request: {exc}") from exc


def _export(
    compiled: Any, blob: Path, volatile_tail: tuple[int, int] | None, keep: bool
) -> tuple[float, str, int]:
    """Export to ``blob``: the seconds it took, its identity hash and its bytes."""
    began = time.perf_counter()
    with blob.open("wb") as f:
        f.write(compiled.export_model().getbuffer())
    export_s = time.perf_counter() - began
    identity, size = blob_identity_hash(blob, volatile_tail), blob.stat().st_size
    if not keep:
        blob.unlink()
    return export_s, identity, size


def blob_identity_hash(path: Path, volatile_tail: tuple[int, int] | None = None) -> str:
    """The file's xxh3-128, with the bytes ``[size - start, size - end)`` of
    ``volatile_tail = (start, end)`` read as zeros (a device's random bytes)."""
    import xxhash

    size = path.stat().st_size
    lo, hi = (size - volatile_tail[0], size - volatile_tail[1]) if volatile_tail else (size, size)
    h = xxhash.xxh3_128()
    offset = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            a, b = max(lo - offset, 0), min(hi - offset, len(chunk))
            if a < b:
                chunk = chunk[:a] + bytes(b - a) + chunk[b:]
            h.update(chunk)
            offset += len(chunk)
    return h.hexdigest()


def loaded_libraries(maps: Path = Path("/proc/self/maps")) -> dict[str, str]:
    """Path -> xxh3-128 of each mapped shared library that names a compiler part."""
    paths: set[str] = set()
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return {}  # not Linux: nothing to read, and the record says so (empty)
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].strip()
        name = os.path.basename(path)
        if ".so" in name and any(m in name.lower() for m in LIBRARY_MARKERS):
            paths.add(path)
    out: dict[str, str] = {}
    for path in sorted(paths):
        try:
            out[path] = blob_identity_hash(Path(path))
        except OSError:
            out[path] = "unreadable"  # deleted or replaced while mapped: a difference
    return out


def _rusage_s() -> tuple[float, float]:
    # RUSAGE_SELF sums every thread of the process: OpenVINO compiles on TBB worker
    # threads, so a thread clock would see only the caller waiting.
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def run(request: WorkerRequest) -> dict[str, Any]:
    """Prepare (untimed), compile (timed), export, hash; then read the environment."""
    try:
        import openvino as ov
        import xxhash  # noqa: F401 - fail here, with a clear message, not after compiling
    except ImportError as exc:
        raise BadRequestError(
            f"{sys.executable} cannot import {exc.name}; install openvino and xxhash into "
            "the arm's environment"
        ) from exc

    from ovspec.compile.devices import profile_for
    from ovspec.errors import openvino_message
    from ovspec.ir.specialize import Phase, Specialization, prepare, read_ir

    core = ov.Core()
    try:
        cache_dir = str(core.get_property("CACHE_DIR"))
    except RuntimeError:
        cache_dir = ""  # an OpenVINO that cannot report it has no core-wide cache set either
    if cache_dir:
        raise BadRequestError(
            f"OpenVINO's CACHE_DIR is {cache_dir} in this process; a trial needs it off"
        )
    profile = profile_for(request.device, request.properties)
    try:
        # Loads the plugin before the clock starts: the plugin's load is not the compiler's.
        supported = frozenset(core.get_property(request.device, "SUPPORTED_PROPERTIES"))
    except RuntimeError as exc:
        raise DeviceError(
            f"device {request.device!r} is not usable here: {openvino_message(exc)}"
        ) from exc
    properties = profile.trial_properties(
        profile.required_properties(request.properties), supported
    )

    began = time.perf_counter()
    llm = prepare(read_ir(Path(request.xml_path)))
    spec = Specialization(Phase(request.phase), request.capacity_tokens, request.chunk_tokens)
    model = llm.specialize(spec)
    prepare_s = time.perf_counter() - began

    user0, sys0 = _rusage_s()
    began = time.perf_counter()
    try:
        compiled = core.compile_model(model, request.device, properties)
    except RuntimeError as exc:
        raise CompileError(
            f"{request.device} failed to compile {spec.label}: {openvino_message(exc)}"
        ) from exc
    wall_s = time.perf_counter() - began
    user1, sys1 = _rusage_s()
    # Before the export, which holds the blob in memory once more.
    peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    export_s, blob_hash, blob_bytes = _export(
        compiled, Path(request.blob_path), profile.volatile_blob_tail, request.keep_blob
    )

    # After the timed compile: reading device facts compiles a one-op probe on CPU,
    # which would otherwise warm the plugin for the compile being timed.
    facts = profile.resolve(core, properties)
    versions = core.get_versions(request.device)
    version = versions.get(facts.device) or next(iter(versions.values()), None)
    environment = {
        "openvino": ov.get_version(),
        "device": facts.device,
        "device_version": (
            f"{version.description} {version.build_number}" if version is not None else "unknown"
        ),
        "device_identity": dict(facts.identity),
        "libraries": loaded_libraries(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
    }
    return {
        "format": WORKER_FORMAT_VERSION,
        "ok": True,
        "specialization": spec.label,
        "wall_s": wall_s,
        "cpu_s": (user1 - user0) + (sys1 - sys0),
        "user_s": user1 - user0,
        "sys_s": sys1 - sys0,
        "prepare_s": prepare_s,
        "export_s": export_s,
        "blob_xxh3": blob_hash,
        "blob_bytes": blob_bytes,
        "peak_rss_bytes": peak_rss_bytes,
        "properties_applied": dict(sorted(properties.items())),
        "environment": environment,
        "pid": os.getpid(),
    }


# Error kinds on the wire -> the exception the harness raises for them.
ERROR_KINDS: Mapping[str, Callable[[str], OvspecError]] = {
    "request": BadRequestError,
    "model": ModelError,
    "device": DeviceError,
    "compile": CompileError,
}


def _error_kind(exc: OvspecError) -> str:
    # Most specific first: ModelError and DeviceError are BadRequestErrors.
    for kind, cls in (("model", ModelError), ("device", DeviceError), ("compile", CompileError)):
        if isinstance(exc, cls):
            return kind
    return "request"


def main() -> int:
    try:
        result = run(WorkerRequest.from_json(sys.stdin.read()))
    except OvspecError as exc:
        error = {"format": WORKER_FORMAT_VERSION, "ok": False, "kind": _error_kind(exc)}
        print(json.dumps({**error, "message": str(exc)}), flush=True)
        return 1
    # The result is the last stdout line: anything OpenVINO printed comes before it.
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
