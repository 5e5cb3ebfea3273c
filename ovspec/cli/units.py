"""How the command line writes and reads quantities: one style for bytes everywhere.

Text output shows binary units (``147.1 KiB``, ``1.5 GiB``); JSON output keeps exact
integers in fields whose names end in ``_bytes``. Size options accept ``10G``,
``512M``, ``1.5GiB`` or a byte count with its unit (``4096B``): a bare number is
refused, since ``--size-limit 1.5`` read as bytes evicted every entry (issue 29).
"""

from __future__ import annotations

import re
from typing import Any

import click

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_FACTORS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
MAX_SIZE_BYTES = 2**60  # 1 EiB: more than any disk; a larger size is a typo


def human_bytes(n: int) -> str:
    """``147.1 KiB``: binary units, one decimal above bytes."""
    size = float(n)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``10G`` / ``512MiB`` / ``1.5g`` / ``1000B`` -> bytes (binary multiples).

    Raises ValueError with the accepted forms for anything else: a number without a
    unit, a fraction of a byte, less than 1 byte or more than ``MAX_SIZE_BYTES``.
    """
    match = _SIZE.fullmatch(text)
    if match is None or (match[3] and not match[2] and match[3].lower() != "b"):
        raise ValueError(f"{text!r} is not a size; give e.g. 10G, 512M, 1.5GiB or 4096B")
    if not match[2] and not match[3]:
        raise ValueError(f"size {text!r} has no unit; give e.g. 10G, 512M or 4096B")
    if not match[2] and "." in match[1]:
        raise ValueError(f"size {text!r} is a fraction of a byte; give whole bytes or a unit")
    # Exact for whole numbers (a float would round a large byte count).
    number: str = match[1]
    whole, _, fraction = number.partition(".")
    factor = _FACTORS[match[2].lower()]
    value: int = int(whole) * factor + (int(fraction or "0") * factor) // 10 ** len(fraction)
    if value < 1:
        raise ValueError(f"size {text!r} must be at least 1 byte")
    if value > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r} is over 1 EiB; check the number and its unit")
    return value


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
