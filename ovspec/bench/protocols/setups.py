"""The five decode protocols the bench compares, as values (docs/DESIGN.md defines them).

A protocol fixes which rungs exist, when they are compiled (the loader policy) and
how KV memory is laid out. B0 is the direct max-capacity graph; B1 the shared-max
pyramid; I1 copy-and-grow with every rung compiled up front; I2 the same graphs
compiled one ahead in the background; I3 one-ahead with the remap layout (pages move
at a boundary, nothing is copied); auto copy-and-grow under the ``auto`` policy, its
costs from a calibration run (runner).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ovspec.ladder import Ladder
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import Policy


class Protocol(Enum):
    B0 = "B0"
    B1 = "B1"
    I1 = "I1"
    I2 = "I2"
    I3 = "I3"
    AUTO = "auto"


@dataclass(frozen=True)
class ProtocolSetup:
    protocol: Protocol
    description: str
    policy: Policy
    kv_layout: KVLayout
    single_top_rung: bool  # B0: one graph at the ladder's top capacity

    def ladder(self, ladder: Ladder) -> Ladder:
        return Ladder((ladder.top_tokens,)) if self.single_top_rung else ladder


SETUPS: dict[Protocol, ProtocolSetup] = {
    Protocol.B0: ProtocolSetup(
        Protocol.B0,
        "direct: one max-capacity graph, max KV from the start",
        Policy.EAGER,
        KVLayout.COPY_AND_GROW,
        single_top_rung=True,
    ),
    Protocol.B1: ProtocolSetup(
        Protocol.B1,
        "shared-max pyramid: every rung up front, views into one max KV",
        Policy.EAGER,
        KVLayout.SHARED_MAX,
        single_top_rung=False,
    ),
    Protocol.I1: ProtocolSetup(
        Protocol.I1,
        "copy-and-grow, every rung compiled up front",
        Policy.EAGER,
        KVLayout.COPY_AND_GROW,
        single_top_rung=False,
    ),
    Protocol.I2: ProtocolSetup(
        Protocol.I2,
        "copy-and-grow, successors compiled one ahead in the background",
        Policy.ONE_AHEAD,
        KVLayout.COPY_AND_GROW,
        single_top_rung=False,
    ),
    Protocol.I3: ProtocolSetup(
        Protocol.I3,
        "remap: successors one ahead, KV pages moved at a boundary (no copy)",
        Policy.ONE_AHEAD,
        KVLayout.REMAP,
        single_top_rung=False,
    ),
    Protocol.AUTO: ProtocolSetup(
        Protocol.AUTO,
        "copy-and-grow, the auto policy: rungs and build starts chosen from measured costs",
        Policy.AUTO,
        KVLayout.COPY_AND_GROW,
        single_top_rung=False,
    ),
}

CONTROL = Protocol.I1
# What a bench runs unless asked: auto needs a calibration run first (opt in).
DEFAULT_PROTOCOLS = (
    Protocol.B0,
    Protocol.B1,
    Protocol.I1,
    Protocol.I2,
    Protocol.I3,
)  # boundary logits are compared against this protocol's run
