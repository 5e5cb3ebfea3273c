"""Whether an imported graph is the specialization its key names: its token input, its
past K/V inputs, its attention mask and its logits must have the static shapes (or
bounds) the specialization and the model's roles give. A blob whose shapes say another
specialization (an unsigned manifest pointing decode@32's key at decode@64's payload)
imports fine and would fail at the first ``set_tensor``; this refuses it before it is
committed or used. A graph whose LM head was cut out ends at the hidden state instead.
"""

from __future__ import annotations

import openvino as ov

from ovspec.ir.headcut import HIDDEN_OUTPUT
from ovspec.ir.roles import ModelRoles
from ovspec.ir.specialize import Specialization


def _dims(shape: ov.PartialShape) -> list[tuple[int, int]]:
    """Each dimension as (least, most); -1 for an unbounded most."""
    return [(d.get_min_length(), d.get_max_length()) for d in shape]


def _wrong(name: str, got: ov.PartialShape, want: list[tuple[int, int]]) -> str | None:
    if _dims(got) == want:
        return None
    shown = [str(a) if a == b else f"{a}..{b}" for a, b in want]
    return f"{name} is {got}, not [{','.join(shown)}]"


def mismatch(compiled: ov.CompiledModel, spec: Specialization, roles: ModelRoles) -> str | None:
    """Why ``compiled`` is not ``spec``'s graph of the model ``roles`` describe; None if
    its inputs and outputs are what ``spec`` makes of them."""
    inputs = {name: port.get_partial_shape() for port in compiled.inputs for name in port.names}
    outputs = {name: port.get_partial_shape() for port in compiled.outputs for name in port.names}
    cap, chunk = spec.capacity_tokens, spec.chunk_tokens
    if roles.input_ids not in inputs:
        return f"it has no input {roles.input_ids}"
    # A prefill graph with the live-tokens state takes 1..chunk tokens per call.
    ids = inputs[roles.input_ids]
    took = [(1, 1), (chunk, chunk)] if ids.is_static else [(1, 1), (1, chunk)]
    problems = [_wrong(roles.input_ids, ids, took)]
    for role in roles.kv:
        if role.past_input not in inputs:
            problems.append(f"it has no input {role.past_input}")
            continue
        want = [(d, d) for d in role.shape(1, cap)]
        problems.append(_wrong(role.past_input, inputs[role.past_input], want))
    mask = inputs.get(roles.attention_mask)
    if mask is not None:
        span = (cap + chunk, cap + chunk) if mask.is_static else (cap + 1, cap + chunk)
        problems.append(_wrong(roles.attention_mask, mask, [(1, 1), span]))
    logits = outputs.get(roles.logits)
    if logits is None and HIDDEN_OUTPUT in outputs:
        pass  # its LM head was cut out (ir/headcut.py): the shared head returns the logits
    elif logits is None:
        problems.append(f"it has no output {roles.logits}")
    elif roles.vocab_tokens is not None:
        last = _dims(logits)[-1:] if logits.rank.is_static else []
        if last != [(roles.vocab_tokens, roles.vocab_tokens)]:
            problems.append(f"{roles.logits} is {logits}, not {roles.vocab_tokens} wide")
    found = [p for p in problems if p is not None]
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"it is not {spec.label}'s graph: {found[0]}{more}"
