"""Saved conversations: a KV snapshot's file format and its store key. A file is a magic
line, a JSON header (identity, tokens, arrays), the raw arrays and an xxh3-128 of all of
it; no pickle (a shared store must not run code). Reads verify the digest and every
offset before an array is made, and refuse a file saved for another model or graph.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from ovspec.errors import BadRequestError
from ovspec.store.keys import COMPONENT_NAMES, BlobKey, explain

MAGIC = b"OVSPEC-SESSION\n"
# History: 1 — first format (2026-12).
FORMAT_VERSION = 1
DIGEST_BYTES = 16
# Array types a snapshot may hold: the KV's own (bf16 paged blocks travel as uint8).
ALLOWED_DTYPES = frozenset({"|u1", "|i1", "<u2", "<f2", "<f4", "<i4"})
# A header bigger than this is not one ovspec wrote (tokens are most of it).
MAX_HEADER_BYTES = 64 << 20
# The session "format" key component: never a blob key's (those are small integers).
SESSION_KEY_FORMAT = f"session-{FORMAT_VERSION}"


@dataclass(frozen=True)
class SavedSession:
    """What a file holds: whose KV it is, the conversation's tokens, how many of them
    the KV holds, the arrays, and free-form notes (e.g. a chat's messages)."""

    identity: Mapping[str, str]
    tokens: tuple[int, ...]
    live_tokens: int
    arrays: Mapping[str, np.ndarray]
    notes: Mapping[str, object]


def session_key(identity: Mapping[str, str], tokens: Sequence[int]) -> BlobKey:
    """The store key of a KV over ``tokens``: the identity's components, the tokens'
    digest in place of a specialization."""
    values = {name: identity.get(name, "") for name in COMPONENT_NAMES}
    digest = xxhash.xxh3_128_hexdigest(np.asarray(tokens, np.int64).tobytes())
    values["format"] = SESSION_KEY_FORMAT
    values["specialization"] = f"{identity.get('specialization', '')} tokens={len(tokens)}:{digest}"
    return BlobKey.from_values(values)


def encode(saved: SavedSession) -> list[bytes]:
    """The file's pieces, digest last."""
    offset = 0
    described = []
    for name, array in saved.arrays.items():
        if array.dtype.str not in ALLOWED_DTYPES:
            raise ValueError(f"cannot save a {array.dtype} array")
        described.append(
            {"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        )
        offset += array.nbytes
    header = json.dumps(
        {
            "format": FORMAT_VERSION,
            "identity": dict(saved.identity),
            "tokens": list(saved.tokens),
            "live_tokens": saved.live_tokens,
            "arrays": described,
            "notes": dict(saved.notes),
        },
        separators=(",", ":"),
    ).encode()
    pieces = [MAGIC, len(header).to_bytes(8, "little"), header]
    pieces += [np.ascontiguousarray(a).tobytes() for a in saved.arrays.values()]
    digest = xxhash.xxh3_128()
    for piece in pieces:
        digest.update(piece)
    return [*pieces, digest.digest()]


def write_file(path: Path, saved: SavedSession) -> int:
    """Write atomically (temp file, fsync, rename); the bytes written."""
    pieces = encode(saved)
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=".ovspec-session-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for piece in pieces:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return sum(len(p) for p in pieces)


def read_file(path: Path, expected: Mapping[str, str] | None = None) -> SavedSession:
    """The verified session in ``path``; ``BadRequestError`` in one line when it is not a
    session file, is damaged, or was saved for another identity than ``expected``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadRequestError(f"cannot read the session {path}: {exc.strerror or exc}") from exc
    return decode(data, str(path), expected)


def decode(data: bytes, where: str, expected: Mapping[str, str] | None = None) -> SavedSession:
    if not data.startswith(MAGIC):
        raise BadRequestError(f"{where} is not an ovspec session file")
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if len(data) < len(MAGIC) + 8 + DIGEST_BYTES or xxhash.xxh3_128_digest(body) != digest:
        raise BadRequestError(f"the session {where} is damaged or truncated (its checksum differs)")
    start = len(MAGIC) + 8
    header_bytes = int.from_bytes(body[len(MAGIC) : start], "little")
    try:
        if header_bytes > MAX_HEADER_BYTES or start + header_bytes > len(body):
            raise ValueError("header size")
        header = json.loads(body[start : start + header_bytes])
        if header["format"] != FORMAT_VERSION:
            raise ValueError(f"format {header['format']}")
        identity = {str(k): str(v) for k, v in dict(header["identity"]).items()}
        tokens = tuple(int(t) for t in header["tokens"])
        live = int(header["live_tokens"])
        arrays = _arrays(body, start + header_bytes, header["arrays"])
        notes = dict(header.get("notes", {}))
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequestError(f"the session {where} has a malformed header ({exc})") from exc
    if not 0 <= live <= len(tokens):
        raise BadRequestError(f"the session {where} claims {live} live of {len(tokens)} tokens")
    if expected is not None:
        differ = [d.name for d in explain(dict(expected), identity)]
        if differ:
            raise BadRequestError(
                f"the session {where} was saved for another model or graph "
                f"(differs in {', '.join(differ)}); open it with the model it was saved from"
            )
    return SavedSession(identity, tokens, live, arrays, notes)


def _arrays(body: bytes, base: int, described: object) -> dict[str, np.ndarray]:
    if not isinstance(described, list):
        raise ValueError("arrays is not a list")
    arrays: dict[str, np.ndarray] = {}
    for item in described:
        dtype = np.dtype(str(item["dtype"]))
        if dtype.str not in ALLOWED_DTYPES:
            raise ValueError(f"array type {item['dtype']}")
        shape = tuple(int(d) for d in item["shape"])
        if any(d < 0 for d in shape):
            raise ValueError(f"shape {shape}")
        count = int(np.prod(shape, dtype=np.int64))
        begin = base + int(item["offset"])
        end = begin + count * dtype.itemsize
        if int(item["offset"]) < 0 or end > len(body):
            raise ValueError(f"array {item['name']} runs past the file")
        arrays[str(item["name"])] = np.frombuffer(body, dtype, count, begin).reshape(shape).copy()
    return arrays
