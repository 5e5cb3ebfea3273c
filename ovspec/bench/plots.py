"""PNG plots of bench runs, drawn from measured events (matplotlib, Agg backend).

``timeline``: per protocol, one lane of decoding and one of compiles (foreground and
background), the seed's Sketch 2 from real timestamps. ``kv_over_tokens``: reserved
KV bytes against live tokens for each protocol, with the migration peaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on build machines

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

DECODE_COLOR = "#c0392b"  # the seed's red: useful inference
COMPILE_FG_COLOR = "#1f3a93"  # foreground compile: blocks the first token
COMPILE_BG_COLOR = "#5dade2"  # background compile: hidden behind decoding
WAIT_COLOR = "#f39c12"


def _decode_spans(steps: Sequence[Sequence[float]]) -> list[tuple[float, float, int, bool]]:
    """Merge consecutive steps on one rung into (start, end, capacity, prefill) spans."""
    spans: list[tuple[float, float, int, bool]] = []
    for live, capacity, began, infer, prefill in steps:
        del live
        end = began + infer
        if spans and spans[-1][2] == capacity and spans[-1][3] == bool(prefill):
            spans[-1] = (spans[-1][0], end, int(capacity), bool(prefill))
        else:
            spans.append((began, end, int(capacity), bool(prefill)))
    return spans


def _compile_spans(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, str, bool]]:
    starts: dict[str, Mapping[str, Any]] = {}
    spans = []
    for event in events:
        if event["kind"] == "load_start":
            starts[event["spec"]] = event
        elif event["kind"] in ("loaded", "failed") and event["spec"] in starts:
            start = starts.pop(event["spec"])
            spans.append((start["at_s"], event["at_s"], event["spec"], bool(start["foreground"])))
    return spans


def timeline(runs: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path:
    """One panel per protocol (name -> timeline dict from the bench worker)."""
    names = list(runs)
    fig, axes = plt.subplots(
        len(names), 1, figsize=(11, 1.6 * len(names) + 1), sharex=True, squeeze=False
    )
    for ax, name in zip(axes[:, 0], names, strict=True):
        data = runs[name]
        for start, end, capacity, prefill in _decode_spans(data["steps"]):
            ax.broken_barh(
                [(start, end - start)],
                (1.1, 0.8),
                color=DECODE_COLOR,
                alpha=0.55 if prefill else 0.9,
            )
            if not prefill:
                ax.text(start, 2.0, f"{capacity}", fontsize=7, va="bottom")
        for start, end, _spec, foreground in _compile_spans(data["events"]):
            ax.broken_barh(
                [(start, max(end - start, 1e-3))],
                (0.1, 0.8),
                color=COMPILE_FG_COLOR if foreground else COMPILE_BG_COLOR,
            )
        for event in data["events"]:
            if event["kind"] == "wait":
                ax.broken_barh(
                    [(event["at_s"] - event["seconds"], event["seconds"])],
                    (1.1, 0.8),
                    color=WAIT_COLOR,
                )
        for boundary in data.get("boundaries", []):
            ax.axvline(boundary["began_s"], color="black", lw=0.6, ls=":")
        ax.set_yticks([0.5, 1.5], ["compile", "decode"])
        ax.set_ylim(0, 2.4)
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontweight="bold")
    axes[-1, 0].set_xlabel("seconds since start")
    fig.legend(
        handles=[
            Patch(color=DECODE_COLOR, label="decode (lighter: prefill)"),
            Patch(color=COMPILE_FG_COLOR, label="compile + import, foreground"),
            Patch(color=COMPILE_BG_COLOR, label="compile + import, background"),
            Patch(color=WAIT_COLOR, label="waiting at a boundary"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.965),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def kv_over_tokens(runs: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path:
    """Reserved KV MiB against live tokens, one line per protocol."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    # Protocols that reserve alike draw on top of each other: vary the dash.
    styles = ["-", "--", "-.", ":"]
    for index, (name, data) in enumerate(runs.items()):
        pairs = data["reserved_kv"]
        tokens = [p[0] for p in pairs]
        mib = [p[1] / 2**20 for p in pairs]
        (line,) = ax.step(
            tokens, mib, where="post", label=name, lw=1.8, ls=styles[index % len(styles)]
        )
        # Copying migrations only: a shared-max "migration" allocates nothing.
        peaks = [m for m in data.get("migrations", []) if m["allocated_bytes"] > 0]
        ax.plot(
            [m["at_live_tokens"] for m in peaks],
            [m["peak_reserved_bytes"] / 2**20 for m in peaks],
            marker="^",
            ls="none",
            color=line.get_color(),
            ms=5,
        )
    ax.set_xlabel("live tokens")
    ax.set_ylabel("reserved KV (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(
        title="▲ old + new buffers\n    while copying", loc="upper left", bbox_to_anchor=(1.01, 1.0)
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
