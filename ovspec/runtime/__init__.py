"""Decoding through a ladder: the lazy loader, its deadline plan, KV memory, the
decode session, text in and out, and the library entry points ``open``/``decode``.

Imports ``compile``, ``ir``, ``store`` and the primitives. Sampling, generation with
stop conditions and chat prompts live here; batching lands here.
"""

from __future__ import annotations

__all__ = ["DecodeResult", "decode", "open"]


def __getattr__(name: str) -> object:
    # ``ovspec.runtime.decode``/``open`` are public, but ``ovspec plan --help`` imports
    # ovspec.runtime.plan and must not load OpenVINO: re-export lazily.
    if name in __all__:
        from ovspec.runtime import decoding

        return getattr(decoding, name)
    raise AttributeError(f"module 'ovspec.runtime' has no attribute {name!r}")
