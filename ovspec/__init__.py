"""ovspec: static capacity specializations of LLM IR, a content-addressed blob store,
and a one-ahead lazy loader for long-context decode on static-shape accelerators.

The library surface: ``open`` a model (a folder, a ``.gguf`` file or ``builtin:PRESET``)
as a loader, ``decode`` or ``generate`` on it, text through ``tokenizer``/``Tokenizer``.
"""

from typing import TYPE_CHECKING

from ovspec.errors import OvspecError
from ovspec.ladder import DEFAULT_LADDER_TOKENS, Ladder
from ovspec.version import __version__

if TYPE_CHECKING:  # what the names below resolve to, for type checkers
    from ovspec.runtime.decoding import DecodeResult, OpenOptions, Tuning, decode, open
    from ovspec.runtime.generation import Generation, StopReason, generate
    from ovspec.runtime.loader import Policy
    from ovspec.runtime.sampling import GenerationConfig
    from ovspec.runtime.tokenizer import Tokenizer, tokenizer

__all__ = [
    "DEFAULT_LADDER_TOKENS",
    "DecodeResult",
    "Generation",
    "GenerationConfig",
    "Ladder",
    "OpenOptions",
    "OvspecError",
    "Policy",
    "StopReason",
    "Tokenizer",
    "Tuning",
    "__version__",
    "decode",
    "generate",
    "open",
    "tokenizer",
]
# Loaded on first use: they import OpenVINO, and importing ovspec alone (keys, stats, the
# CLI's --help) must not.
_LAZY = {
    "DecodeResult": "ovspec.runtime.decoding",
    "OpenOptions": "ovspec.runtime.decoding",
    "Tuning": "ovspec.runtime.decoding",
    "decode": "ovspec.runtime.decoding",
    "open": "ovspec.runtime.decoding",
    "Generation": "ovspec.runtime.generation",
    "StopReason": "ovspec.runtime.generation",
    "generate": "ovspec.runtime.generation",
    "GenerationConfig": "ovspec.runtime.sampling",
    "Policy": "ovspec.runtime.loader",
    "Tokenizer": "ovspec.runtime.tokenizer",
    "tokenizer": "ovspec.runtime.tokenizer",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ovspec' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
