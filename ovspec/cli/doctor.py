"""``ovspec doctor``: why a model does or does not specialize, stage by stage."""

from __future__ import annotations

from pathlib import Path

import click

from ovspec.cli import cli
from ovspec.cli.options import (
    cache_dir_option,
    checked_model,
    chunk_option,
    emit_json,
    json_option,
    ladder_option,
    model_folder,
)
from ovspec.errors import ModelError
from ovspec.ladder import Ladder


@cli.command()
@click.argument("model")
@ladder_option
@chunk_option
@cache_dir_option
@json_option
def doctor(
    model: str, ladder: Ladder, chunk_tokens: int, cache_dir: Path | None, as_json: bool
) -> None:
    """Report how MODEL goes through ovspec: roles found, KV layout, rewrites, what failed.

    Tries decode and prefill at the ladder's first and last rung. Exit 0 when every
    stage passes; otherwise the report, then one error line and exit 2.
    """
    from ovspec.ir.diagnose import diagnose
    from ovspec.ir.normalize import RULE_PRESENT_NAMES
    from ovspec.ir.specialize import Specialization, prefill_specialization

    checked_model(model, ladder)  # before a built-in model is written into the store
    model_dir = model_folder(model, cache_dir)
    rungs = sorted({ladder.capacities_tokens[0], ladder.top_tokens})
    specs = [Specialization.decode(c) for c in rungs]
    specs += [prefill_specialization(c, chunk_tokens) for c in rungs]
    report = diagnose(model_dir.xml_path, specs)

    roles = report.roles
    if as_json:
        emit_json(
            {
                "model": str(model_dir.root),
                "ok": report.ok,
                "variables": report.variables,
                "inputs": list(report.inputs),
                "roles": None
                if roles is None
                else {
                    "input_ids": roles.input_ids,
                    "attention_mask": roles.attention_mask,
                    "position_ids": roles.position_ids,
                    "logits": roles.logits,
                    "vocab_tokens": report.vocab_tokens,
                    "kv": [
                        {
                            "layer": r.layer,
                            "kind": r.kind.value,
                            "past": r.past_input,
                            "present": r.present_output,
                            "seq_axis": r.seq_axis,
                        }
                        for r in roles.kv
                    ],
                },
                "kv_layout": report.kv_layout,
                "rewrites": [
                    {"rule": r.rule, "node": r.node, "detail": r.detail} for r in report.rewrites
                ],
                "checks": [
                    {"stage": c.stage, "ok": c.ok, "detail": c.detail} for c in report.checks
                ],
            }
        )
    else:
        click.echo(f"model     {model_dir.root}")
        click.echo(f"inputs    {'; '.join(report.inputs) or '-'}")
        click.echo(f"state     {report.variables} variables")
        rules: dict[str, list[str]] = {}
        for rewrite in report.rewrites:
            # A rename says more than the node it renamed (genai's share one name).
            shown = rewrite.detail if rewrite.rule == RULE_PRESENT_NAMES else rewrite.node
            rules.setdefault(rewrite.rule, []).append(shown)
        rewritten = [
            f"{rule} x{len(nodes)} ({', '.join(nodes[:4])}" + (", ...)" if len(nodes) > 4 else ")")
            for rule, nodes in rules.items()
        ]
        click.echo(f"rewrites  {'; '.join(rewritten) or 'none'}")
        if roles is not None:
            click.echo(
                f"roles     input_ids={roles.input_ids} attention_mask={roles.attention_mask} "
                f"position_ids={roles.position_ids or '-'} logits={roles.logits} "
                f"(vocabulary {report.vocab_tokens or '?'})"
            )
            click.echo(f"kv        {report.kv_layout}")
            for role in roles.kv:
                click.echo(
                    f"          layer {role.layer} {role.kind.value:<5} {role.past_input} -> "
                    f"{role.present_output} (seq axis {role.seq_axis})"
                )
        for check in report.checks:
            click.echo(f"{'ok' if check.ok else 'FAILED':<9} {check.stage}: {check.detail}")
    failure = report.first_failure
    if failure is not None:
        raise ModelError(f"{model} fails at {failure.stage}: {failure.detail}")
