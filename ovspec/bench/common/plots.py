"""PNG plots of bench runs, drawn from measured events (matplotlib, Agg backend).

``timeline``: per protocol, one lane of decoding and one of compiles (foreground and
background), the seed's Sketch 2 from real timestamps. ``kv_over_tokens``: reserved
KV bytes against live tokens for each protocol, with the migration peaks.
``kv_over_time``: virtual (reserved) and physical (committed) KV against seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ovspec.extras import missing_extra

try:
    import matplotlib
except ModuleNotFoundError as exc:
    raise missing_extra("bench", "the benchmark plots") from exc

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
        # Copying migrations only: shared-max allocates nothing, remap copies nothing.
        peaks = [m for m in data.get("migrations", []) if m.get("copied_bytes", 1) > 0]
        peaks = [m for m in peaks if m["allocated_bytes"] > 0]
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


def kv_over_time(
    runs: Mapping[str, Mapping[str, Any]],
    path: Path,
    title: str,
    x_label: str = "seconds since start",
) -> Path:
    """Two panels against seconds: the KV each protocol reserves (virtual: what a
    device would have to allocate) and what it has committed (physical, measured)."""
    fig, (virtual, physical) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    styles = ["-", "--", "-.", ":"]
    for index, (name, data) in enumerate(runs.items()):
        samples = data.get("kv_samples") or []
        if not samples:
            continue
        # A sample is taken after each step; a step that crossed a boundary may have
        # waited for its graph, so the new rung starts at the crossing, not at the sample.
        crossings = sorted(b["began_s"] for b in data.get("boundaries", []))
        samples = _with_crossings(samples, crossings)
        seconds = [s[0] for s in samples]
        style = styles[index % len(styles)]
        (line,) = virtual.step(
            seconds, [s[2] / 2**20 for s in samples], where="post", lw=1.6, ls=style, label=name
        )
        known = [(t, s[3]) for t, s in zip(seconds, samples, strict=True) if s[3] is not None]
        if known:
            physical.step(
                [t for t, _ in known],
                [b / 2**20 for _, b in known],
                where="post",
                lw=1.6,
                ls=style,
                color=line.get_color(),
            )
        # The worst moment of each boundary (old and new buffers both held).
        at = {b["at_live_tokens"]: b["began_s"] for b in data.get("boundaries", [])}
        peaks = [
            (at[m["at_live_tokens"]], m["peak_physical_bytes"])
            for m in data.get("migrations", [])
            if m.get("peak_physical_bytes") is not None and m["at_live_tokens"] in at
        ]
        physical.plot(
            [t for t, _ in peaks],
            [b / 2**20 for _, b in peaks],
            marker="^",
            ls="none",
            ms=5,
            color=line.get_color(),
        )
    virtual.set_ylabel("virtual (reserved) KV, MiB")
    physical.set_ylabel("physical (committed) KV, MiB")
    physical.set_xlabel(x_label)
    for ax in (virtual, physical):
        ax.grid(alpha=0.3)
    virtual.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    physical.text(
        1.01,
        1.0,
        "▲ at a boundary:\n   old + new\n   buffers held",
        transform=physical.transAxes,
        va="top",
        fontsize=8,
    )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _with_crossings(
    samples: Sequence[Sequence[Any]], crossings: Sequence[float]
) -> list[list[Any]]:
    """Samples plus, at each boundary crossing, a copy of the first sample after it."""
    out: list[list[Any]] = []
    pending = list(crossings)
    for sample in samples:
        while pending and out and out[-1][0] < pending[0] < sample[0]:
            out.append([pending.pop(0), *sample[1:]])
        while pending and pending[0] <= (out[-1][0] if out else sample[0]):
            pending.pop(0)
        out.append(list(sample))
    return out
