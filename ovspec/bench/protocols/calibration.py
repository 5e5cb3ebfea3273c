"""The auto arm's costs: what one untimed I1 run measured (each graph's build + import,
each rung's decode seconds per token, the prompt's run), as ``AutoCosts`` the auto runs
of the same arm plan from, the way a machine's history would feed the policy.
"""

from __future__ import annotations

from ovspec.bench.protocols.metrics import RunFigures
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
