"""Refusals that explain: when a static reshape fails, name the node and the pattern
ovspec expected there, in one line.

Owns reading OpenVINO's shape-inference failure (which node, which op, what it said)
and the table of what each op needs once the inputs are static.
"""

from __future__ import annotations

import re

from ovspec.errors import openvino_message

# What each op needs once every input is static: the "expected" half of the message.
EXPECTED_PATTERNS = {
    "Broadcast": (
        "a target shape whose every dim equals the data's dim or 1 (a 0 that means 'keep' "
        "is rewritten only in BIDIRECTIONAL mode)"
    ),
    "Reshape": "a target shape with the input's element count (0 = keep, -1 = infer)",
    "Concat": "inputs equal on every axis but the concat axis",
    "ScaledDotProductAttention": (
        "query, key and value with equal batch and head dims and key/value of the same "
        "length as the mask's last dim"
    ),
    "Add": "operands that broadcast (numpy rules)",
    "Multiply": "operands that broadcast (numpy rules)",
    "Select": "condition and branches that broadcast (numpy rules)",
    "Tile": "repeats that keep the sequence length",
}
_DEFAULT_PATTERN = (
    "shapes that follow from the static inputs: input_ids [1, chunk], attention_mask "
    "[1, capacity + chunk], past KV [1, kv_heads, capacity, head_dim]"
)
_NODE_RE = re.compile(r"While validating node '(?:[\w.]+::)?(?P<op>\w+) (?P<name>[^ ']+)")
_FRIENDLY_RE = re.compile(r"friendly_name '(?P<name>[^']+)'")


def failing_node(exc: BaseException) -> tuple[str, str] | None:
    """``(friendly name, op type)`` of the node OpenVINO's error names, if it names one."""
    text = str(exc)
    node = _NODE_RE.search(text)
    if node is None:
        return None
    friendly = _FRIENDLY_RE.search(text)
    return (friendly.group("name") if friendly else node.group("name")), node.group("op")


def reshape_refusal(label: str, exc: BaseException) -> str:
    """The one-line message for a failed static reshape to ``label``."""
    found = failing_node(exc)
    if found is None:
        return f"cannot reshape the IR to {label}: {openvino_message(exc)}"
    name, op = found
    # OpenVINO's last line is the reason; the lines before repeat the node and shapes.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = openvino_message(RuntimeError(lines[-1] if lines else ""), limit_chars=200)
    pattern = EXPECTED_PATTERNS.get(op, _DEFAULT_PATTERN)
    return (
        f"cannot reshape the IR to {label}: node {name} ({op}) fails shape inference "
        f"({reason}); expected {pattern}; `ovspec doctor MODEL` shows roles and rewrites"
    )
