"""The one exception hierarchy of ovspec.

Every error a user can cause or meet is an ``OvspecError`` subclass that owns its
exit code; the CLI prints it as one line and exits with it. Library code raises these
and never prints or exits. A message names what to change with ``arg("ladder")``: a
library caller reads the Python argument (``ladder=``), a command-line user the option
(``--ladder``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Marks an argument's name (and an optional example value) inside a message; rendered
# by OvspecError.__str__ (library) or OvspecError.cli_message (command line). U+001E
# and U+001F cannot come from user text.
_ARG = re.compile("\x1f([a-z_][a-z0-9_]*)(?:\x1e([^\x1f]*))?\x1f")


def arg(name: str, example: str | None = None) -> str:
    """The argument ``name`` (a Python parameter name) inside an error message, with an
    example value if given: ``ladder=1024`` for the library, ``--ladder 1024`` on the
    command line."""
    return f"\x1f{name}\x1f" if example is None else f"\x1f{name}\x1e{example}\x1f"


class OvspecError(Exception):
    """Base of all ovspec errors. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1

    def __str__(self) -> str:
        def python(m: re.Match[str]) -> str:
            if m[1] == "properties" and m[2] and "=" in m[2]:
                # OpenVINO properties are a mapping in Python: properties={"K": "V"}.
                key, _, value = m[2].partition("=")
                return f"properties={{{key!r}: {value!r}}}"
            return f"{m[1]}={m[2] or ''}"

        return _ARG.sub(python, super().__str__())

    def cli_message(self, options: Mapping[str, str] | None = None) -> str:
        """The message with each argument as its command-line option: ``--kebab-case``,
        or what ``options`` maps the Python name to (``properties`` -> ``--config``)."""
        names = options or {}

        def option(m: re.Match[str]) -> str:
            flag = names.get(m[1], "--" + m[1].replace("_", "-"))
            # A switch takes no value: "trust_shared=True" is just the flag.
            return flag if m[2] in (None, "True") else f"{flag} {m[2]}"

        return _ARG.sub(option, super().__str__())


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


class BlobRefusedError(StoreError):
    """A level of the store would not hand out a blob: its bytes do not match the record
    that names them, or it is larger than the caller allows. Nothing of it was kept."""


class RemoteError(StoreError):
    """The shared remote tier failed. Callers fail open (one warning, then compile)
    unless strict: a remote can only lose a hit, never fail a build."""


class RemoteUnavailableError(RemoteError):
    """The remote cannot be reached (refused, timed out, 5xx) or refused the credentials."""


class RemoteIntegrityError(RemoteError, BlobRefusedError):
    """The remote sent something its manifest does not vouch for, or a bad manifest."""


class RemoteSignatureError(RemoteIntegrityError):
    """A manifest is unsigned, signed with an unknown key, or its signature does not match,
    and this client holds a signing key."""


class RemoteReadOnlyError(RemoteError):
    """A write was asked of a remote this client may only read."""


class CompileError(OvspecError):
    """OpenVINO failed to compile or import a specialization."""

    exit_code = 3


class TrialError(OvspecError):
    """A compile trial cannot produce an honest verdict (mixed environments, n too small)."""

    exit_code = 4


class MissingExtraError(OvspecError):
    """An optional dependency is not installed; the message names the extra to install."""

    exit_code = 2


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
