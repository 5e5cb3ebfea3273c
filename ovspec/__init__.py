"""ovspec: static capacity specializations of LLM IR, a content-addressed blob store,
and a one-ahead lazy loader for long-context decode on static-shape accelerators."""

from ovspec.errors import OvspecError
from ovspec.ladder import DEFAULT_LADDER_TOKENS, Ladder
from ovspec.version import __version__

__all__ = ["DEFAULT_LADDER_TOKENS", "Ladder", "OvspecError", "__version__", "open"]


def __getattr__(name: str) -> object:
    # ovspec.open loads OpenVINO; importing ovspec alone (keys, stats, the CLI's
    # --help) must not.
    if name == "open":
        from ovspec.runtime.decoding import open as open_loader

        return open_loader
    raise AttributeError(f"module 'ovspec' has no attribute {name!r}")
