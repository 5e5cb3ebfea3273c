"""How the command line writes and reads quantities: one style for bytes everywhere.

Text output shows binary units (``147.1 KiB``, ``1.5 GiB``); JSON output keeps exact
integers in fields whose names end in ``_bytes``. Size options accept ``10G``,
``512M``, ``1.5GiB`` or a plain number of bytes.
"""

from __future__ import annotations

import re
from typing import Any

import click

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_FACTORS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def human_bytes(n: int) -> str:
    """``147.1 KiB``: binary units, one decimal above bytes."""
    size = float(n)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``10G`` / ``512MiB`` / ``1.5g`` / ``1000`` -> bytes (binary multiples).

    Raises ValueError with the accepted forms for anything else.
    """
    match = _SIZE.fullmatch(text)
    if match is None or (match[3] and not match[2] and match[3].lower() != "b"):
        raise ValueError(f"{text!r} is not a size; give e.g. 10G, 512M, 1.5GiB or a byte count")
    value = float(match[1]) * _FACTORS[match[2].lower()]
    if value < 1:
        raise ValueError(f"size {text!r} must be at least 1 byte")
    return int(value)


class SizeType(click.ParamType[int, Any]):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{count} {noun if count == 1 else (plural_form or noun + 's')}"
