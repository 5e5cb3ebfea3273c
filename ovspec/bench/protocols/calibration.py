"""The auto arm's costs: what one untimed run measured (each graph's build + import,
each rung's decode seconds per token, the prompt's run), as ``AutoCosts`` the auto runs
of the same arm plan from, the way a machine's history would feed the policy. The run is
I2's when the bench has it: its builds run one at a time behind the decode, as auto's
do; I1 builds two side by side before the prompt, which under the split share one host
core, so each takes about twice as long.
"""

from __future__ import annotations

from collections.abc import Sequence

from ovspec.bench.protocols.metrics import RunFigures
from ovspec.bench.protocols.setups import CONTROL, Protocol
from ovspec.ladder import Ladder
from ovspec.runtime.autopolicy import AutoCosts


def costs_from_run(figures: RunFigures, ladder: Ladder, prompt_tokens: int) -> AutoCosts:
    """Per rung: its decode graph's measured ready cost and its band's step time; the
    prompt rung's prefill graph and prompt run (bigger start rungs are scaled by
    ``AutoCosts``). A rung the run did not load or decode on is left out (auto then
    plans without it, or falls back to one ahead)."""
    ready = {
        int(label.split("@")[1]): seconds
        for label, seconds in figures.ready_cost_s.items()
        if label.startswith("decode@")
    }
    decode = {b.high_tokens: b.infer_s / b.steps for b in figures.bands if b.steps}
    prompt_rung = ladder.rung_for(prompt_tokens)
    prefill = [s for label, s in figures.ready_cost_s.items() if label.startswith("prefill@")]
    return AutoCosts(
        ready_s=ready,
        decode_s_per_token={r: s for r, s in decode.items() if r in ladder.capacities_tokens},
        prefill_ready_s={prompt_rung: prefill[0]} if prefill else {},
        prefill_s={prompt_rung: figures.prefill_s},
    )


def calibration_protocol(protocols: Sequence[Protocol]) -> Protocol:
    """The protocol whose untimed run calibrates auto: I2 if the bench runs it, else I1."""
    return Protocol.I2 if Protocol.I2 in protocols else CONTROL
