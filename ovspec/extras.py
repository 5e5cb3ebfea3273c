"""The optional extras of ``pip install 'ovspec[EXTRA]'``: which modules each brings,
and the check a command runs before it needs them, so a missing extra ends as one line
naming it (exit 2) instead of a traceback halfway through a run.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from ovspec.errors import MissingExtraError

# extra -> the top-level modules it installs (pyproject.toml's optional-dependencies).
EXTRAS: Mapping[str, tuple[str, ...]] = {
    "bench": ("matplotlib", "psutil"),  # the benchmarks' plots; the KV benchmark's RSS
    "serve": ("fastapi", "uvicorn", "sse_starlette", "prometheus_client"),  # ovspec serve
}


def missing_extra(extra: str, what: str) -> MissingExtraError:
    """The error for ``what`` (a command, or what a library call was drawing) needing
    ``extra``."""
    modules = " and ".join(EXTRAS[extra])
    return MissingExtraError(
        f"{what} needs the {extra!r} extra ({modules}): pip install 'ovspec[{extra}]'"
    )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it outright
        return False


def require_extra(extra: str, what: str) -> None:
    """Raise ``MissingExtraError`` unless every module of ``extra`` can be imported."""
    if not all(_importable(module) for module in EXTRAS[extra]):
        raise missing_extra(extra, what)
