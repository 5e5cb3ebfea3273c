"""Per-graph NPUW properties: a prompt graph that does not fold compiles as one partition
(and its key says so); step graphs, folded graphs and a user's choice are left alone."""

from __future__ import annotations

from ovspec.compile.devices import profile_for
from ovspec.compile.devices.npuw import ONLINE_PIPELINE
from ovspec.ir.specialize import Specialization

NPUW = {"NPUW_DEVICES": "CPU"}
EXACT = {**NPUW, **profile_for("NPU", NPUW).exact_properties}
PREFILL = Specialization.prefill(128, 64)
DECODE = Specialization.decode(128)


def test_an_unfolded_prompt_graph_is_one_partition_and_nothing_else_changes() -> None:
    npuw = profile_for("NPU", EXACT)
    assert EXACT["NPUW_FOLD"] == "NO"
    assert npuw.graph_properties(PREFILL, EXACT) == {ONLINE_PIPELINE: "NONE"}
    assert npuw.graph_properties(DECODE, EXACT) == {}
    folded = {**EXACT, "NPUW_FOLD": "YES"}
    assert npuw.graph_properties(PREFILL, folded) == {}
    chosen = {**EXACT, ONLINE_PIPELINE: "REP"}
    assert npuw.graph_properties(PREFILL, chosen) == {}
    assert profile_for("CPU").graph_properties(PREFILL, {}) == {}
