"""``ovspec doctor``'s library half: run the IR -> specialization pipeline stage by stage
and say what each stage found, what it rewrote, and where it failed.

Owns the ``Diagnosis`` record (roles, KV layout, rewrites, checks); it never raises for
a model it cannot specialize: that is the answer it reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from ovspec.errors import ModelError
from ovspec.ir.normalize import Rewrite, normalize
from ovspec.ir.rewrites import RewriteSet, apply_rewrites
from ovspec.ir.roles import ModelRoles, discover_roles
from ovspec.ir.specialize import (
    DynamicLLM,
    Phase,
    Specialization,
    prepare,
    read_ir,
    to_stateless,
)


@dataclass(frozen=True)
class Check:
    """One stage of the pipeline and how it went."""

    stage: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Diagnosis:
    xml_path: Path
    variables: int  # state variables of the IR as read (0: already stateless)
    inputs: tuple[str, ...]  # name [shape] type, as read
    rewrites: tuple[Rewrite, ...]
    roles: ModelRoles | None
    vocab_tokens: int | None
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    @property
    def kv_layout(self) -> str | None:
        """e.g. ``2 layers x key/value, [batch, 2, seq, 16] f32, 256 bytes/token``."""
        if self.roles is None or not self.roles.kv:
            return None
        role = self.roles.kv[0]
        dims = [
            "batch" if axis == 0 else "seq" if axis == role.seq_axis else str(dim)
            for axis, dim in enumerate(role.shape_template)
        ]
        uniform = all(
            r.shape_template == role.shape_template and r.seq_axis == role.seq_axis
            for r in self.roles.kv
        )
        kinds = "/".join(sorted({r.kind.value for r in self.roles.kv}))
        return (
            f"{self.roles.layers} layers x {kinds}, [{', '.join(dims)}] "
            f"{role.element_type.get_type_name()}"
            f"{'' if uniform else ' (layers differ)'}, "
            f"{self.roles.kv_bytes_per_token} bytes/token"
        )


def diagnose(xml_path: Path, specs: Sequence[Specialization]) -> Diagnosis:
    """Read, convert, normalize, find roles, then try each specialization in ``specs``."""
    checks: list[Check] = []
    try:
        model = read_ir(xml_path)
    except ModelError as exc:
        return Diagnosis(xml_path, 0, (), (), None, None, (Check("read", False, str(exc)),))
    variables = len(model.get_variables())
    inputs = tuple(_describe(p.output(0)) for p in model.get_parameters())
    checks.append(Check("read", True, f"{len(model.get_ordered_ops())} ops"))

    def done(rewrites: tuple[Rewrite, ...] = (), llm: DynamicLLM | None = None) -> Diagnosis:
        roles = llm.roles if llm is not None else None
        vocab = llm.vocab_tokens if llm is not None else None
        return Diagnosis(xml_path, variables, inputs, rewrites, roles, vocab, tuple(checks))

    # Stage by stage on a copy, so a failure is pinned to its stage; then the real thing.
    probe = model.clone()
    stage, rewrites = "stateless", tuple[Rewrite, ...]()
    try:
        to_stateless(probe)
        checks.append(Check(stage, True, f"{variables} variables -> inputs/outputs"))
        stage = "normalize"
        rewrites = normalize(probe).rewrites
        checks.append(Check(stage, True, f"{len(rewrites)} rewrites"))
        stage = "roles"
        discover_roles(probe)
    except ModelError as exc:
        checks.append(Check(stage, False, str(exc)))
        return done(rewrites)
    llm = prepare(model)
    checks.append(Check("roles", True, f"{len(llm.roles.kv)} KV tensors"))
    for spec in specs:
        try:
            static = llm.specialize(spec)
        except ModelError as exc:
            checks.append(Check(spec.label, False, str(exc)))
            continue
        checks.append(Check(spec.label, True, f"{len(static.get_ordered_ops())} ops, static"))
        # The speed rewrites fail open (a refused one leaves the graph as it was): say
        # which would not apply.
        rewrites_set = RewriteSet.every()
        prefill = spec.phase is Phase.PREFILL
        try:
            notes = apply_rewrites(static, llm.roles, rewrites_set, prefill, spec.capacity_tokens)
        except (ModelError, RuntimeError) as exc:
            notes = (f"failed: {exc}",)
        applied = rewrites_set.canonical if not notes else "; ".join(notes)
        checks.append(Check(f"{spec.label} rewrites", True, applied))
    return done(llm.normalized.rewrites, llm)


def _describe(output: ov.Output) -> str:
    name = output.get_any_name() if output.names else "<unnamed>"
    return f"{name} {output.get_partial_shape()} {output.get_element_type().get_type_name()}"
