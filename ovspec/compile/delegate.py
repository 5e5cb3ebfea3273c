"""Building blobs outside this process: what a ``Compiler`` asks of a build delegate.

Under the device/host split (``split.HostBuilder``) a process on the host cores builds
each blob into the store and the compiler imports what it published. The interface and
the record of one delegated build live here, so the compiler never imports the split
(whose host process runs a compiler of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # this module stays free of OpenVINO: the host process pins first
    from ovspec.ir.roles import ModelRoles
    from ovspec.ir.specialize import Specialization


@dataclass(frozen=True)
class DelegatedBuild:
    """What the delegate did for one specialization."""

    spec: str
    hit: bool  # the store had it (another process built it)
    compile_s: float
    export_s: float
    wait_s: float  # for another process building the same key
    host_s: float  # the whole build there (compile, export, the validating import, publish)
    pid: int
    affinity: tuple[int, ...]


class BuildDelegate(Protocol):
    """Builds a specialization's blob into the compiler's store, elsewhere."""

    def request(self, spec: Specialization) -> None:
        """Queue the build of ``spec`` without waiting (builds run in the order asked)."""
        ...

    def build(self, spec: Specialization) -> DelegatedBuild:
        """Block until the blob of ``spec`` is published (or found) in the store."""
        ...

    def roles(self) -> ModelRoles:
        """The model's roles, read where the IR is prepared."""
        ...
