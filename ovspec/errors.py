"""The one exception hierarchy of ovspec.

Every error a user can cause or meet is an ``OvspecError`` subclass that owns its
exit code; the CLI prints ``str(error)`` as one line and exits with it. Library code
raises these and never prints or exits.
"""

from __future__ import annotations

import re


class OvspecError(Exception):
    """Base of all ovspec errors. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


class BadRequestError(OvspecError):
    """The request itself is wrong: bad flag value, bad ladder, unknown device."""

    exit_code = 2


class ModelError(BadRequestError):
    """The model folder or IR cannot be used (missing, not an IR, no KV cache...)."""


class LadderError(BadRequestError):
    """A ladder that is malformed or does not fit the model."""


class DeviceError(BadRequestError):
    """The device is unknown here or cannot compile what was asked."""


class StoreError(OvspecError):
    """The store cannot be opened, written or trusted."""

    exit_code = 2


class CompileError(OvspecError):
    """OpenVINO failed to compile or import a specialization."""

    exit_code = 3


class TrialError(OvspecError):
    """A compile trial cannot produce an honest verdict (mixed environments, n too small)."""

    exit_code = 4


class PatchError(OvspecError):
    """A compiler source tree is not in a state the patch can be applied to or reverted from."""

    exit_code = 2


def openvino_message(exc: BaseException, limit_chars: int = 400) -> str:
    """OpenVINO's exception text without its source-location prefixes, on one line.

    OpenVINO prefixes every layer with ``Exception from src/...cpp:NN:``; what the user
    needs is the rest (for an NPU with no compiler: which library failed to load).
    """
    text = re.sub(r"Exception from \S+:\d+:\s*", "", str(exc))
    text = re.sub(r"Check '[^']*' failed at \S+:\d+:\s*", "", text)
    text = " ".join(text.split())
    if not text:
        return type(exc).__name__
    return text if len(text) <= limit_chars else text[: limit_chars - 3] + "..."


class RemapUnsupportedError(OvspecError):
    """This platform cannot map KV pages (not Linux, an unknown ABI, an old kernel)."""

    exit_code = 2


class MappingError(OvspecError):
    """The kernel refused a mapping call (mmap, mremap, madvise); the message has errno."""

    exit_code = 1
