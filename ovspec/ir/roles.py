"""Role discovery: which parameters and results of a stateless LLM graph are what.

Roles come from the graph: each KV pair is found by following a ``present`` result
back to the Concat that produced it and from there to the ``past`` parameter; the
sequence axis is that Concat's axis; key vs value is the attention input it feeds.
Names only break ties the graph cannot (layer numbers), never pick an axis.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from enum import Enum

import openvino as ov

from ovspec.errors import ModelError

# Ops a KV tensor may pass through between the past parameter and its Concat, or
# between the Concat and the attention op (GQA repeat, layout changes, casts).
_PASS_THROUGH_TO_CONCAT = {"Convert", "Gather"}
_PASS_THROUGH_TO_ATTENTION = {
    "Convert",
    "Unsqueeze",
    "Broadcast",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Tile",
    "Concat",
    "Gather",
}
_ATTENTION_OPS = {"ScaledDotProductAttention"}


class KVKind(Enum):
    KEY = "key"
    VALUE = "value"


@dataclass(frozen=True)
class KVRole:
    """One past/present KV tensor pair of one layer."""

    layer: int
    kind: KVKind
    past_input: str
    present_output: str
    seq_axis: int
    # The past tensor's shape with batch and sequence left as 0; other dims static.
    shape_template: tuple[int, ...]
    element_type: ov.Type

    def shape(self, batch: int, seq_tokens: int) -> list[int]:
        dims = list(self.shape_template)
        dims[0] = batch
        dims[self.seq_axis] = seq_tokens
        return dims

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this tensor at batch 1."""
        n = 1
        for axis, dim in enumerate(self.shape_template):
            if axis not in (0, self.seq_axis):
                n *= dim
        return n * int(self.element_type.size)


@dataclass(frozen=True)
class ModelRoles:
    input_ids: str
    attention_mask: str
    position_ids: str | None
    logits: str
    kv: tuple[KVRole, ...]
    vocab_tokens: int | None = None  # the logits' last dimension, if the IR states it

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(role.bytes_per_token for role in self.kv)

    @property
    def layers(self) -> int:
        return len({role.layer for role in self.kv})

    def to_json(self) -> dict[str, object]:
        """A JSON form, stored beside each blob so a warm start never reads the IR."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "logits": self.logits,
            "vocab_tokens": self.vocab_tokens,
            "kv": [
                {
                    "layer": r.layer,
                    "kind": r.kind.value,
                    "past_input": r.past_input,
                    "present_output": r.present_output,
                    "seq_axis": r.seq_axis,
                    "shape_template": list(r.shape_template),
                    "element_type": r.element_type.get_type_name(),
                }
                for r in self.kv
            ],
        }

    @classmethod
    def from_json(cls, data: object) -> ModelRoles:
        """The inverse of ``to_json``; ValueError for anything malformed."""
        try:
            assert isinstance(data, dict)
            kv = tuple(
                KVRole(
                    layer=int(r["layer"]),
                    kind=KVKind(r["kind"]),
                    past_input=str(r["past_input"]),
                    present_output=str(r["present_output"]),
                    seq_axis=int(r["seq_axis"]),
                    shape_template=tuple(int(d) for d in r["shape_template"]),
                    element_type=_element_type(str(r["element_type"])),
                )
                for r in data["kv"]
            )
            position_ids = data["position_ids"]
            vocab = data.get("vocab_tokens")
            roles = cls(
                input_ids=str(data["input_ids"]),
                attention_mask=str(data["attention_mask"]),
                position_ids=None if position_ids is None else str(position_ids),
                logits=str(data["logits"]),
                kv=kv,
                vocab_tokens=None if vocab is None else int(vocab),
            )
        except (AssertionError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"malformed roles record: {exc!r}") from exc
        if not roles.kv:
            raise ValueError("malformed roles record: no KV roles")
        return roles


def _element_type(name: str) -> ov.Type:
    """``"f32"`` -> ``ov.Type.f32`` (ov.Type's own constructor takes numpy dtypes)."""
    element_type = getattr(ov.Type, name, None)
    if not isinstance(element_type, ov.Type):
        raise ValueError(f"unknown element type {name!r}")
    return element_type


def discover_roles(model: ov.Model) -> ModelRoles:
    """Find the roles of a stateless model (past_* parameters, present_* results)."""
    params = {p.output(0).get_any_name(): p for p in model.get_parameters() if p.output(0).names}
    input_ids = _require_input(params, "input_ids")
    attention_mask = _require_input(params, "attention_mask")
    position_ids = "position_ids" if "position_ids" in params else None

    kv: list[KVRole] = []
    logits: str | None = None
    for index, result in enumerate(model.get_results()):
        out_name = result.output(0).get_any_name() if result.output(0).names else f"result{index}"
        producer = result.input_value(0).get_node()
        past = kv_past_parameter(producer)
        if past is None:
            if logits is None and (out_name == "logits" or "logits" in result.output(0).names):
                logits = out_name
            continue
        concat = producer
        kv.append(_kv_role(concat, past, out_name))
    if not kv:
        raise ModelError(
            "the IR has no KV cache: no output is a Concat of a past-KV parameter "
            "(export with --task text-generation-with-past)"
        )
    if logits is None:
        raise ModelError("the IR has no 'logits' output")
    _check_unique_present_names(kv)
    kv.sort(key=lambda r: (r.layer, r.kind is KVKind.VALUE))
    seen = {(r.layer, r.kind) for r in kv}
    if len(seen) != len(kv):
        raise ModelError("two KV tensors claim the same layer and kind; cannot tell layers apart")
    return ModelRoles(
        input_ids, attention_mask, position_ids, logits, tuple(kv), _vocab_tokens(model, logits)
    )


def _vocab_tokens(model: ov.Model, logits: str) -> int | None:
    shape = model.output(logits).get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() == 0:
        return None
    last = shape[shape.rank.get_length() - 1]
    return last.get_length() if last.is_static else None


def _check_unique_present_names(kv: list[KVRole]) -> None:
    # A shared name would make every name-keyed lookup read one tensor twice: silent
    # garbage, so refuse (normalize renames what it can before roles are found).
    owners: dict[str, list[str]] = {}
    for role in kv:
        owners.setdefault(role.present_output, []).append(role.past_input)
    for name, pasts in owners.items():
        if len(pasts) > 1:
            raise ModelError(
                f"KV outputs of {' and '.join(pasts)} share the name {name!r}; expected one "
                "distinct present output per past input"
            )


def _require_input(params: dict[str, ov.Node], name: str) -> str:
    if name not in params:
        raise ModelError(
            f"the IR has no '{name}' input (inputs: {', '.join(sorted(params))}); "
            "ovspec expects an optimum-intel text-generation-with-past export"
        )
    return name


def kv_past_parameter(node: ov.Node) -> ov.Node | None:
    """The past parameter if ``node`` is a KV Concat (past ++ new along one axis)."""
    if node.get_type_name() != "Concat" or node.get_input_size() != 2:
        return None
    source = node.input_value(0).get_node()
    while source.get_type_name() in _PASS_THROUGH_TO_CONCAT:
        source = source.input_value(0).get_node()
    if source.get_type_name() != "Parameter":
        return None
    return source


def _kv_role(concat: ov.Node, past: ov.Node, present_name: str) -> KVRole:
    past_name = past.output(0).get_any_name()
    pshape = past.output(0).get_partial_shape()
    rank = pshape.rank.get_length()
    axis = int(concat.get_attributes()["axis"])
    seq_axis = axis + rank if axis < 0 else axis
    template: list[int] = []
    for i, dim in enumerate(pshape):
        if i in (0, seq_axis):
            template.append(0)
        elif dim.is_static:
            template.append(dim.get_length())
        else:
            raise ModelError(
                f"KV input {past_name} has a dynamic dimension {i} that is neither batch nor "
                f"sequence (shape {pshape}); cannot make it static"
            )
    if seq_axis == 0:
        raise ModelError(f"KV input {past_name} concatenates along axis 0; expected batch first")
    return KVRole(
        layer=_layer_number(past_name, present_name),
        kind=_kv_kind(concat, past_name),
        past_input=past_name,
        present_output=present_name,
        seq_axis=seq_axis,
        shape_template=tuple(template),
        element_type=past.output(0).get_element_type(),
    )


def _kv_kind(concat: ov.Node, past_name: str) -> KVKind:
    """Key or value: which attention input the Concat feeds (names only as a fallback)."""
    queue: deque[ov.Output] = deque([concat.output(0)])
    seen: set[int] = set()
    while queue:
        out = queue.popleft()
        for target in out.get_target_inputs():
            node = target.get_node()
            if node.get_instance_id() in seen:
                continue
            seen.add(node.get_instance_id())
            kind = node.get_type_name()
            if kind in _ATTENTION_OPS:
                port = target.get_index()
                if port == 1:
                    return KVKind.KEY
                if port == 2:
                    return KVKind.VALUE
            elif kind in _PASS_THROUGH_TO_ATTENTION:
                queue.extend(node.outputs())
    lowered = past_name.lower()
    if re.search(r"(^|[._])(key|k)([._]|$)", lowered):
        return KVKind.KEY
    if re.search(r"(^|[._])(value|v)([._]|$)", lowered):
        return KVKind.VALUE
    raise ModelError(f"cannot tell whether KV input {past_name} is a key or a value")


def _layer_number(past_name: str, present_name: str) -> int:
    for name in (past_name, present_name):
        match = re.search(r"\d+", name)
        if match:
            return int(match.group())
    raise ModelError(f"cannot tell the layer of KV input {past_name}: its name has no number")
