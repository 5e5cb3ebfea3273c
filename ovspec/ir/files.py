"""The file names of an OpenVINO model folder, and an IR's rt_info read without OpenVINO.

Owns what both model folders and GGUF intake need to know about the files on disk,
so neither imports the other.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

from ovspec.errors import ModelError

IR_XML_NAME = "openvino_model.xml"
TOKENIZER_XML_NAME = "openvino_tokenizer.xml"
DETOKENIZER_XML_NAME = "openvino_detokenizer.xml"


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
