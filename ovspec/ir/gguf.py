"""GGUF input: a ``.gguf`` file becomes an OpenVINO IR folder once, kept beside the built-in
models in the store's ``models/`` folder, keyed by the file's digest.

openvino-genai's GGUF reader builds the IR (``LLMPipeline(file, enable_save_ov_model=True)``
writes it, with tokenizer and detokenizer IRs, next to the file it reads); ovspec adds a
``config.json`` with what only the GGUF header says (the position limit, EOS). The
folder appears by one rename, so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from ovspec.errors import ModelError, openvino_message
from ovspec.ir.files import IR_XML_NAME, TOKENIZER_XML_NAME, read_rt_info
from ovspec.ir.materialize import hold_model

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
MANIFEST_NAME = "ovspec_gguf.json"
# What openvino-genai 2026.4's GGUF reader builds (src/cpp/src/gguf_utils/).
GENAI_ARCHITECTURES = ("llama", "qwen2", "qwen3")
GENAI_READS = (
    "it reads llama, qwen2 and qwen3 files with F16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K weights"
)
_CHUNK_BYTES = 1 << 24


def is_gguf_reference(reference: str) -> bool:
    return reference.lower().endswith(GGUF_SUFFIX)


@dataclass(frozen=True)
class GGUFHeader:
    """What ovspec reads from a GGUF file's metadata and tensor table (not the weights)."""

    version: int
    architecture: str
    context_tokens: int | None
    tensors: int
    data_end_bytes: int | None  # where the last tensor ends; None if a type is unknown


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of a GGUF file; ``ModelError`` if it is not one, or is cut short."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = _parse_header(_Reader(f, size), path)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from exc
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{path} has a damaged GGUF header ({exc}); re-download it") from exc
    # genai reads a truncated file without a word (its tensors then hold garbage).
    if header.data_end_bytes is not None and size < header.data_end_bytes:
        raise ModelError(
            f"{path} is truncated: {size:,} bytes, its tensor table needs "
            f"{header.data_end_bytes:,}; re-download it"
        )
    return header


# GGUF metadata value types (the GGUF spec): fixed-size scalars by struct code.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_SCALARS |= {10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGML tensor types: (elements per block, bytes per block), for the size check.
_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24)}
_BLOCKS |= {8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144)}
_BLOCKS |= {13: (256, 176), 14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2)}
_BLOCKS |= {26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}
_DEFAULT_ALIGNMENT = 32
# Bounds a crafted header cannot talk past (issue 29, item 8): every length and count is
# checked against the bytes left in the file before anything is read or allocated, and
# against limits no real file comes near. ggml's own reader allows 4 dimensions and no
# arrays of arrays; a little nesting is accepted, not a recursion as deep as a file asks.
_MAX_STRING_BYTES = 1 << 24  # the longest real strings are chat templates (~100 KB)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_ARRAY_DEPTH = 4
# The fewest bytes one entry can take: a metadata pair (empty key, type, a 1-byte
# value), a tensor (empty name, n_dims, type, offset), an array item by its type.
_KV_MIN_BYTES, _TENSOR_MIN_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8
_ITEM_MIN_BYTES = {_STRING: 8, _ARRAY: 12}


class _Reader:
    """A GGUF file read forward, every read and skip checked against the bytes left."""

    def __init__(self, f: BinaryIO, size_bytes: int) -> None:
        self.f = f
        self.size_bytes = size_bytes

    def tell(self) -> int:
        return self.f.tell()

    def left_bytes(self) -> int:
        return self.size_bytes - self.f.tell()

    def take(self, n: int, what: str) -> bytes:
        self._fits(n, what)
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError(f"the file ends inside {what}")
        return data

    def skip(self, n: int, what: str) -> None:
        self._fits(n, what)
        self.f.seek(n, os.SEEK_CUR)

    def unpack(self, code: str, what: str) -> tuple[Any, ...]:
        return struct.unpack(code, self.take(struct.calcsize(code), what))

    def count(self, n: int, item_bytes: int, what: str) -> int:
        """``n`` entries of at least ``item_bytes`` each must fit in what is left."""
        if n * item_bytes > self.left_bytes():
            raise ValueError(
                f"{what} claims {n:,} entries; the {self.left_bytes():,} bytes left hold fewer"
            )
        return n

    def _fits(self, n: int, what: str) -> None:
        if n > self.left_bytes():
            raise ValueError(
                f"{what} of {n:,} bytes runs past the end of the file "
                f"({self.left_bytes():,} bytes left)"
            )


def _parse_header(r: _Reader, path: Path) -> GGUFHeader:
    if r.f.read(4) != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    (version,) = r.unpack("<I", "the version")
    if version < 2:
        raise ModelError(f"{path} is GGUF version {version}; readers need version 2 or later")
    tensor_count, kv_count = r.unpack("<QQ", "the counts")
    r.count(kv_count, _KV_MIN_BYTES, "the metadata table")
    r.count(tensor_count, _TENSOR_MIN_BYTES, "the tensor table")
    values: dict[str, object] = {}
    for _ in range(kv_count):
        key = _read_string(r, "a metadata key")
        (kind,) = r.unpack("<I", f"the type of {key!r}")
        values[key] = _read_value(r, kind, key, depth=0)
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path} has no general.architecture; not an LLM GGUF file")
    context = values.get(f"{arch}.context_length")
    end: int | None = 0
    for _ in range(tensor_count):
        name = _read_string(r, "a tensor name")
        (n_dims,) = r.unpack("<I", f"the dimensions of {name!r}")
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims:,} dimensions; GGUF allows {_MAX_DIMS}")
        dims = r.unpack(f"<{n_dims}Q", f"the shape of {name!r}")
        kind, offset = r.unpack("<IQ", f"the type of {name!r}")
        if end is not None and kind in _BLOCKS:
            per_block, block_bytes = _BLOCKS[kind]
            elements = 1
            for d in dims:
                elements *= d
            end = max(end, offset + elements // per_block * block_bytes)
        else:
            end = None
    alignment = values.get("general.alignment", _DEFAULT_ALIGNMENT)
    align = alignment if isinstance(alignment, int) and alignment > 0 else _DEFAULT_ALIGNMENT
    data_start = -(-r.tell() // align) * align
    return GGUFHeader(
        version=version,
        architecture=arch,
        context_tokens=context if isinstance(context, int) and context > 0 else None,
        tensors=tensor_count,
        data_end_bytes=None if end is None else data_start + end,
    )


def _read_string(r: _Reader, what: str) -> str:
    (length,) = r.unpack("<Q", f"the length of {what}")
    if length > _MAX_STRING_BYTES:
        raise ValueError(f"{what} claims {length:,} bytes; GGUF strings here stay under 16 MiB")
    return r.take(length, what).decode("utf-8")


def _read_value(r: _Reader, kind: int, key: str, depth: int) -> object:
    if kind in _SCALARS:
        code = "<" + _SCALARS[kind]
        return r.unpack(code, f"the value of {key!r}")[0]
    if kind == _STRING:
        return _read_string(r, f"the value of {key!r}")
    if kind == _ARRAY:
        if depth >= _MAX_ARRAY_DEPTH:
            raise ValueError(f"{key!r} nests arrays deeper than {_MAX_ARRAY_DEPTH}")
        item_kind, count = r.unpack("<IQ", f"the array {key!r}")
        if item_kind in _SCALARS:  # skipped, not decoded: vocabularies are large
            item_bytes = struct.calcsize("<" + _SCALARS[item_kind])
            r.skip(r.count(count, item_bytes, f"the array {key!r}") * item_bytes, key)
        else:
            r.count(count, _ITEM_MIN_BYTES.get(item_kind, 1), f"the array {key!r}")
            for _ in range(count):
                _read_value(r, item_kind, key, depth + 1)
        return None
    raise ValueError(f"unknown metadata type {kind} of {key!r}")


def gguf_digest(path: Path) -> str:
    """xxh3-128 of the whole file (the folder's key; a re-quantized file is another model)."""
    digest = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_source_name(folder: Path) -> str | None:
    """The file name a store's GGUF model folder was built from (None: not such a folder,
    or its manifest is unreadable)."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    source = manifest.get("source") if isinstance(manifest, dict) else None
    return Path(source).name if isinstance(source, str) and source else None


def import_gguf(
    path: str | Path, models_root: Path | None, announce: Callable[[str], None] | None = None
) -> Path:
    """The IR folder of a GGUF file, built once through openvino-genai under
    ``models_root`` (None: no store is open to build it into); returns the folder.
    ``announce`` hears, before it starts, that the conversion runs."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise ModelError(f"GGUF file {source} does not exist")
    if models_root is None:
        raise ModelError(f"the IR of {source} is written into a store's models folder; open one")
    header = read_gguf_header(source)
    check_readable(source, header)
    digest = gguf_digest(source)
    folder = models_root / f"gguf-{digest}"

    def write(staging: Path) -> None:
        if announce is not None:
            announce(
                f"converting {source.name} to an OpenVINO IR with openvino-genai (once per "
                "file, kept in the store; this can take a minute)..."
            )
        try:
            _build_with_genai(source.resolve(), staging)
            _write_config(staging, header, digest, source)
        except OSError as exc:
            raise ModelError(f"cannot write the IR of {source} into {models_root}: {exc}") from exc

    return hold_model(folder, write)


def check_readable(source: Path, header: GGUFHeader) -> None:
    # genai fails on other architectures with a bare "unordered_map::at": say it first.
    if header.architecture not in GENAI_ARCHITECTURES:
        raise ModelError(
            f"{source} holds a {header.architecture!r} model; openvino-genai's GGUF reader "
            f"builds {', '.join(GENAI_ARCHITECTURES)} only ({GENAI_READS})"
        )


def _build_with_genai(source: Path, staging: Path) -> None:
    try:
        import openvino_genai
    except ImportError as exc:
        raise ModelError(
            f"reading {source.name} needs openvino-genai's GGUF reader: "
            "pip install 'ovspec[genai]' (or openvino-genai)"
        ) from exc
    # genai saves the IR next to the file it reads: read it through a link in the staging
    # folder. Constructing the pipeline compiles the model once on CPU (the cost of one
    # genai start); only its saved files are kept.
    link = staging / source.name
    link.symlink_to(source)
    try:
        pipeline = openvino_genai.LLMPipeline(str(link), "CPU", enable_save_ov_model=True)
    except Exception as exc:  # genai surfaces C++ errors as several Python types
        raise ModelError(
            f"openvino-genai cannot read {source}: {type(exc).__name__}: "
            f"{openvino_message(exc)} ({GENAI_READS})"
        ) from exc
    del pipeline
    link.unlink()
    if not (staging / IR_XML_NAME).is_file():
        raise ModelError(f"openvino-genai read {source} but saved no {IR_XML_NAME}")


def _write_config(staging: Path, header: GGUFHeader, digest: str, source: Path) -> None:
    config: dict[str, object] = {"model_type": header.architecture}
    if header.context_tokens is not None:
        config["max_position_embeddings"] = header.context_tokens
    with contextlib.suppress(ModelError):
        eos = read_rt_info(staging / TOKENIZER_XML_NAME).get("eos_token_id", "")
        if eos.isdigit():
            config["eos_token_id"] = int(eos)
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    manifest = {
        "source": str(source),
        "digest_xxh3_128": digest,
        "gguf_version": header.version,
        "built_by": "openvino-genai LLMPipeline(enable_save_ov_model=True)",
        # genai saves the IR with compress_to_fp16: for F16/F32 files f32 constants
        # (RoPE frequencies, norms, biases) are rounded to f16, so this IR can differ
        # slightly from the model genai runs from the GGUF itself.
        "note": "f32 constants of F16/F32 GGUF files are saved rounded to f16",
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
