"""The files of one entry: its payload, its sidecar, and moving them aside.

Hashing and verifying payloads, reading and atomically writing sidecars (temp ->
fsync -> rename), quarantine and deletion. The caller holds the key's lock for
anything that changes files.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from enum import Enum
from pathlib import Path

from ovspec.store.digests import size_and_digest
from ovspec.store.layout import STORE_FORMAT_VERSION, StoreLayout, fsync_dir
from ovspec.store.records import StoreEntry, entry_from_json, record_json


class Verdict(Enum):
    OK = "ok"
    MISSING = "missing"
    CORRUPT = "corrupt"


def hash_file(path: Path) -> tuple[int, str] | None:
    """(size, xxh3-128 hex) of a file; None if absent."""
    try:
        return size_and_digest(path)
    except FileNotFoundError:
        return None


def unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def verify(entry: StoreEntry) -> Verdict:
    """Does the payload on disk match ``entry``'s size and checksum?"""
    try:
        size = entry.path.stat().st_size
    except FileNotFoundError:
        return Verdict.MISSING
    if size != entry.size_bytes:
        return Verdict.CORRUPT  # no need to hash a file of the wrong length
    measured = hash_file(entry.path)
    if measured is None:
        return Verdict.MISSING
    if measured != (entry.size_bytes, entry.checksum):
        return Verdict.CORRUPT
    return Verdict.OK


class EntryFiles:
    """Payload and sidecar operations under one store layout."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout

    def read_sidecar(self, hex_: str) -> StoreEntry | None:
        """The sidecar of ``hex_``; None if absent. ValueError if malformed."""
        try:
            text = self.layout.sidecar_path(hex_).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"sidecar is not JSON: {exc}") from exc
        entry = entry_from_json(obj, self.layout.payload_path(hex_))
        if entry.hex != hex_:
            raise ValueError(f"sidecar names hex {entry.hex}")
        return entry

    def write_sidecar(self, entry: StoreEntry) -> None:
        tmp = self.layout.new_temp(entry.hex, "json")
        try:
            data = json.dumps(
                {"store_format": STORE_FORMAT_VERSION, **record_json(entry)}, indent=1
            ).encode()
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            dest = self.layout.sidecar_path(entry.hex)
            os.replace(tmp, dest)
            fsync_dir(dest.parent)
        except BaseException:
            unlink(tmp)
            raise

    def move_to_quarantine(self, path: Path) -> bool:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        dest = self.layout.quarantine / f"{path.name}.{stamp}.{secrets.token_hex(2)}"
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return False
        return True

    def quarantine_payload_and_sidecar(self, hex_: str) -> bool:
        """Move both aside; whether there was a payload to move."""
        moved = self.move_to_quarantine(self.layout.payload_path(hex_))
        self.move_to_quarantine(self.layout.sidecar_path(hex_))
        return moved

    def delete_payload_and_sidecar(self, hex_: str) -> None:
        unlink(self.layout.payload_path(hex_))
        unlink(self.layout.sidecar_path(hex_))
