"""A model folder as ovspec reads it: the IR pair, config.json, and optional tokenizers.

Validates the folder once and answers the questions the rest of ovspec asks of it
(where the weights are, the position limit, whether a tokenizer ships with it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from ovspec.errors import ModelError
from ovspec.ir.files import (
    DETOKENIZER_XML_NAME,
    IR_XML_NAME,
    TOKENIZER_XML_NAME,
    read_json_object,
)
from ovspec.ir.materialize import hold_model

if TYPE_CHECKING:
    from ovspec.builtin import ModelSpec

__all__ = ["DETOKENIZER_XML_NAME", "IR_XML_NAME", "TOKENIZER_XML_NAME", "ModelDir"]


@dataclass(frozen=True)
class ModelDir:
    """A validated model folder. ``xml_path`` and ``bin_path`` exist."""

    root: Path
    xml_path: Path
    bin_path: Path
    config: dict[str, object]

    @classmethod
    def open(cls, path: str | Path) -> ModelDir:
        """Accept a folder holding ``openvino_model.xml`` or the path of an ``.xml`` itself."""
        p = Path(path).expanduser()
        if not p.exists():
            raise ModelError(f"model path {p} does not exist")
        if p.is_dir():
            xml = p / IR_XML_NAME
            if not xml.is_file():
                xmls = sorted(x.name for x in p.glob("*.xml"))
                hint = f" (found {', '.join(xmls)})" if xmls else ""
                raise ModelError(
                    f"{p} holds no {IR_XML_NAME}{hint}; point at an OpenVINO IR folder"
                )
            root = p
        else:
            if p.suffix != ".xml":
                raise ModelError(f"{p} is not an OpenVINO IR (.xml) file or a model folder")
            xml, root = p, p.parent
        bin_path = xml.with_suffix(".bin")
        if not bin_path.is_file():
            raise ModelError(f"{xml} has no weights file {bin_path.name} beside it")
        _check_looks_like_ir(xml)
        return cls(
            root=root.resolve(),
            xml_path=xml.resolve(),
            bin_path=bin_path.resolve(),
            config=_read_config(root / "config.json"),
        )

    @property
    def max_position_embeddings(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return value if isinstance(value, int) and value > 0 else None

    @property
    def tokenizer_xml(self) -> Path | None:
        path = self.root / TOKENIZER_XML_NAME
        return path if path.is_file() else None

    @property
    def detokenizer_xml(self) -> Path | None:
        path = self.root / DETOKENIZER_XML_NAME
        return path if path.is_file() else None


def _check_looks_like_ir(xml: Path) -> None:
    # Reading a few hundred bytes at each end is enough to tell an IR from a stray file
    # and a whole one from one cut short (issue 29, item 14: a truncated IR used to pass
    # here and fail later, inside a report); the full parse happens later and its errors
    # are mapped there too.
    try:
        with xml.open("rb") as f:
            head = f.read(512)
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - 512))
            tail = f.read()
    except OSError as exc:
        raise ModelError(f"cannot read {xml}: {exc.strerror}") from exc
    if b"<net" not in head:
        raise ModelError(f"{xml} is not an OpenVINO IR (no <net> element at the top)")
    # OpenVINO's serializer ends every IR with the closing tag of its root element.
    if not tail.rstrip().endswith(b"</net>"):
        raise ModelError(
            f"{xml} is cut short ({size:,} bytes, no closing </net>); re-export or copy it again"
        )


def _read_config(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    return read_json_object(path)


BUILTIN_PREFIX = "builtin:"


def writes_into_store(reference: str) -> bool:
    """Whether resolving ``reference`` writes a model into the store's ``models/`` folder
    (a built-in model, or the IR built from a GGUF file)."""
    from ovspec.ir.gguf import is_gguf_reference

    # A GGUF path that is not a file fails in resolve_model before any store is touched.
    gguf = is_gguf_reference(reference) and Path(reference).expanduser().is_file()
    return reference.startswith(BUILTIN_PREFIX) or gguf


def preset_spec(reference: str) -> ModelSpec:
    """The spec of ``builtin:PRESET``; ``ModelError`` naming the presets if unknown."""
    from ovspec.builtin import PRESETS

    preset = reference[len(BUILTIN_PREFIX) :]
    if preset not in PRESETS:
        raise ModelError(
            f"unknown built-in model {preset!r}; choose one of "
            + ", ".join(f"{BUILTIN_PREFIX}{name}" for name in PRESETS)
        )
    return PRESETS[preset]


def resolve_model(
    reference: str, models_root: Path | None, announce: Callable[[str], None] | None = None
) -> ModelDir:
    """A model folder path, a ``.gguf`` file (its IR built once under ``models_root``), or
    ``builtin:PRESET`` (written once under ``models_root``). ``models_root`` None: the
    caller opened no store, so a reference that writes one (``writes_into_store``) is
    refused. ``announce`` hears, before it starts, that a model is being written."""
    from ovspec.ir.gguf import import_gguf, is_gguf_reference

    if is_gguf_reference(reference):
        return ModelDir.open(import_gguf(reference, models_root, announce))
    if not reference.startswith(BUILTIN_PREFIX):
        return ModelDir.open(reference)
    if models_root is None:
        raise ModelError(f"{reference} is written into a store's models folder; open a store")
    # Imported here: building a model needs openvino, a plain path does not.
    from ovspec.builtin import write_model_files

    spec = preset_spec(reference)
    preset = reference[len(BUILTIN_PREFIX) :]
    digest = xxhash.xxh3_64_hexdigest(json.dumps(spec.to_json(), sort_keys=True).encode())
    folder = models_root / f"{preset}-{digest}"

    def write(staging: Path) -> None:
        if announce is not None:
            announce(f"writing the built-in model {reference} into the store (once)...")
        write_model_files(spec, staging)

    return ModelDir.open(hold_model(folder, write))
