"""ovspec: static capacity specializations of LLM IR, a content-addressed blob store,
and a one-ahead lazy loader for long-context decode on static-shape accelerators."""

from ovspec.errors import OvspecError
from ovspec.ladder import DEFAULT_LADDER_TOKENS, Ladder
from ovspec.version import __version__

__all__ = [
    "DEFAULT_LADDER_TOKENS",
    "Ladder",
    "OpenOptions",
    "OvspecError",
    "Tuning",
    "__version__",
    "open",
]
_LAZY = ("OpenOptions", "Tuning", "open")


def __getattr__(name: str) -> object:
    # ovspec.open loads OpenVINO; importing ovspec alone (keys, stats, the CLI's
    # --help) must not.
    if name in _LAZY:
        from ovspec.runtime import decoding

        return getattr(decoding, name)
    raise AttributeError(f"module 'ovspec' has no attribute {name!r}")
