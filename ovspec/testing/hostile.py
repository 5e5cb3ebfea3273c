"""Crafted hostile inputs (issue 29): GGUF headers whose lengths and counts lie, JSON
nested deeper than a parser recurses, a chat template that loops without end, an IR
cut short. The suite and the fault campaign (``bench/faults``) write the same files.
"""

from __future__ import annotations

import html
import re
import shutil
import struct
from pathlib import Path

# GGUF metadata value types used below (the GGUF spec).
_UINT32, _STRING, _ARRAY = 4, 8, 9


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _gguf(tensors: int, pairs: int, body: bytes) -> bytes:
    """A GGUF v3 prefix (magic, version, counts) and a valid architecture pair, then
    ``body``: the hostile part."""
    arch = _string(b"general.architecture") + struct.pack("<I", _STRING) + _string(b"qwen2")
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, pairs) + arch + body


def hostile_gguf_headers() -> dict[str, bytes]:
    """Name -> the bytes of a small GGUF file whose header asks for an impossible read."""
    nested = struct.pack("<IQ", _ARRAY, 1) * 5000 + struct.pack("<IQ", _UINT32, 0)
    return {
        "string of 2^62 bytes": _gguf(0, 2, struct.pack("<Q", 2**62) + b"x" * 64),
        "string of 2^64-1 bytes": _gguf(0, 2, struct.pack("<Q", 2**64 - 1) + b"x" * 64),
        "n_dims 2^32-1": _gguf(1, 1, _string(b"t") + struct.pack("<I", 2**32 - 1) + b"\0" * 64),
        "arrays nested 5000 deep": _gguf(0, 2, _string(b"k") + struct.pack("<I", _ARRAY) + nested),
        "array of 2^62 scalars": _gguf(
            0, 2, _string(b"k") + struct.pack("<I", _ARRAY) + struct.pack("<IQ", 10, 2**62)
        ),
        "2^63 metadata pairs": _gguf(0, 2**63, b""),
    }


def deeply_nested_json(depth: int = 100_000) -> str:
    """A JSON object whose one value is ``depth`` nested arrays (a few hundred KB)."""
    return '{"model_type": "qwen2", "x": ' + "[" * depth + "]" * depth + "}"


# Nested loops of 10^5 x 10^5 iterations: hours of rendering, and the output grows all
# the while. Nothing in it reads a file or runs code.
ENDLESS_CHAT_TEMPLATE = (
    "{% for a in range(100000) %}{% for b in range(100000) %}"
    "{{ messages[0]['content'] }}{% endfor %}{% endfor %}"
)


def with_chat_template(model: Path, copy: Path, template: str) -> Path:
    """A copy of the model folder ``model`` whose tokenizer IR carries ``template``."""
    shutil.copytree(model, copy)
    xml = copy / "openvino_tokenizer.xml"
    value = html.escape(template, quote=True)
    text, n = re.subn(
        r'<chat_template value="[^"]*" />',
        lambda _m: f'<chat_template value="{value}" />',
        xml.read_text(encoding="utf-8"),
    )
    if n != 1:
        raise ValueError(f"{xml} has no chat_template entry to replace")
    xml.write_text(text, encoding="utf-8")
    return copy


def truncated_ir(model: Path, copy: Path, keep_fraction: float = 0.5) -> Path:
    """A copy of the model folder ``model`` whose ``openvino_model.xml`` is cut short."""
    shutil.copytree(model, copy)
    xml = copy / "openvino_model.xml"
    data = xml.read_bytes()
    xml.write_bytes(data[: int(len(data) * keep_fraction)])
    return copy
