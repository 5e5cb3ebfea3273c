"""The file names of an OpenVINO model folder, and an IR's rt_info and weight types read
without OpenVINO.

Owns what both model folders and GGUF intake need to know about the files on disk,
so neither imports the other.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from ovspec.errors import ModelError

IR_XML_NAME = "openvino_model.xml"
TOKENIZER_XML_NAME = "openvino_tokenizer.xml"
DETOKENIZER_XML_NAME = "openvino_detokenizer.xml"
# A model folder's config.json and generation_config.json are a few KB; a file far past
# this is not one (and is not read whole into memory).
MAX_CONFIG_BYTES = 1 << 24


def read_json_object(path: Path) -> dict[str, object]:
    """A model folder's JSON file (config.json, generation_config.json) as an object;
    ``ModelError`` in one line for anything else: unreadable, too large, not JSON,
    nested deeper than the parser recurses (issue 29, item 13), not an object."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MiB; not a model's JSON file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        # json's C scanner recurses once per nesting level and gives up at the
        # interpreter's recursion limit: no model's JSON nests that deep.
        raise ModelError(f"{path} is nested too deeply to parse (damaged or crafted)") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} does not hold a JSON object")
    return data


def read_rt_info(xml: Path) -> dict[str, str]:
    """The top-level ``<rt_info>`` entries of an IR (``name -> value``; nested ones skipped).

    Tokenizer IRs keep ``eos_token_id`` and ``chat_template`` there (openvino-tokenizers
    and openvino-genai write them); parsing the XML avoids compiling the tokenizer.
    """
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise ModelError(f"cannot read the rt_info of {xml}: {exc}") from exc
    info = root.find("rt_info")
    if info is None:
        return {}
    return {child.tag: child.attrib["value"] for child in info if "value" in child.attrib}


# A weight constant in IR v10/v11 XML: a Const layer's data with its place in the .bin.
_CONST_DATA = re.compile(rb'<data element_type="(\w+)"[^>]*\boffset="\d+" size="(\d+)"')
_WEIGHT_MIN_BYTES = 4096  # smaller integer constants are indices and masks, not weights
# Weights stored compressed (integer with scales): OpenVINO's CPU plugin repacks them at
# compile, so they end up in every blob, weightless or not (docs/weightless.md).
COMPRESSED_WEIGHT_TYPES = frozenset({"u4", "i4", "u8", "i8", "nf4", "f4e2m1"})


def compressed_weight_types(xml: Path) -> frozenset[str]:
    """The compressed element types among the IR's weight constants (empty: none)."""
    found = {
        m.group(1).decode()
        for m in _CONST_DATA.finditer(xml.read_bytes())
        if int(m.group(2)) >= _WEIGHT_MIN_BYTES
    }
    return frozenset(found & COMPRESSED_WEIGHT_TYPES)
