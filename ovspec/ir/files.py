"""The file names of an OpenVINO model folder, and an IR's rt_info read without OpenVINO.

Owns what both model folders and GGUF intake need to know about the files on disk,
so neither imports the other.
"""

from __future__ import annotations

import json
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
