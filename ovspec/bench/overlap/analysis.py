"""The cost of host-core work to the split's decode, measured inside one decode: which
slots of steps run with the background load on, how adjacent on/off slots pair up, their
statistics, what they imply for I2 at the campaign's overlap fractions, and the page.

Pure (no OpenVINO): ``overlap.runner`` measures, this module judges and renders.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ovspec.errors import BadRequestError
from ovspec.stats.paired import PairedSummary, summarize_pairs

PAGE = "overlap"

# The background loads, in the order the page lists them. ``build``: the host's own
# work under the split (Compiler.build of the successor rungs into a fresh store, over
# and over); ``import``: the decode-side half of an I2 load (importing a blob, again and
# again); ``memcpy``: a 64 MiB copy loop, the positive control (DRAM traffic a
# weight-streaming step must feel).
LOADS = ("build", "import", "memcpy")
CONTROL_LOAD = "memcpy"


def slot_on(slot: int) -> bool:
    """Whether the load runs during slot ``slot`` (0-based): off, on, on, off, off, on,
    on, off, ... Pairs are slots (2m, 2m + 1), so they alternate off→on and on→off: a
    drift within a pair (a band's steps slowing as the machine does) adds to half the
    pairs and subtracts from the other half instead of biasing every pair one way."""
    return (slot + 1) // 2 % 2 == 1


@dataclass(frozen=True)
class SlotPair:
    """Two adjacent slots of one decode in one band: the median step with the load
    stopped and with it running."""

    decode: int  # which decode of the run (0-based)
    slot: int  # the pair's first slot
    capacity_tokens: int
    off_ms: float
    on_ms: float

    def __post_init__(self) -> None:
        if not (self.off_ms > 0 and self.on_ms > 0):
            raise BadRequestError(f"slot medians {self.off_ms} / {self.on_ms} ms must be > 0")

    @property
    def ratio(self) -> float:
        return self.on_ms / self.off_ms

    def to_json(self) -> list[float]:
        return [self.decode, self.slot, self.capacity_tokens, self.off_ms, self.on_ms]

    @classmethod
    def from_json(cls, row: Sequence[float]) -> SlotPair:
        return cls(int(row[0]), int(row[1]), int(row[2]), float(row[3]), float(row[4]))


def pair_slots(
    step_ms: Sequence[float],
    capacities: Sequence[int],
    on: Sequence[bool],
    slot_steps: int,
    decode: int = 0,
) -> list[SlotPair]:
    """Pairs of one decode's steps (in order, prefill excluded): step i is in slot
    ``i // slot_steps``. A pair counts only when both its slots are complete, every step
    of both has one capacity (a rung boundary inside a pair would compare two graphs)
    and ran in the state ``slot_on`` gives its slot (``on``, as recorded)."""
    if not len(step_ms) == len(capacities) == len(on):
        raise BadRequestError(
            f"{len(step_ms)} step times, {len(capacities)} capacities, {len(on)} states"
        )
    if slot_steps < 1:
        raise BadRequestError(f"slot of {slot_steps} steps; give at least 1")
    pairs: list[SlotPair] = []
    for first in range(0, len(step_ms) // slot_steps - 1, 2):
        lo, mid, hi = first * slot_steps, (first + 1) * slot_steps, (first + 2) * slot_steps
        if len(set(capacities[lo:hi])) != 1:
            continue
        if any(on[i] != slot_on(first) for i in range(lo, mid)) or any(
            on[i] != slot_on(first + 1) for i in range(mid, hi)
        ):
            continue
        a = statistics.median(step_ms[lo:mid])
        b = statistics.median(step_ms[mid:hi])
        off_ms, on_ms = (b, a) if slot_on(first) else (a, b)
        pairs.append(SlotPair(decode, first, capacities[lo], off_ms, on_ms))
    return pairs


def summarize_load(pairs: Sequence[SlotPair]) -> PairedSummary:
    """Each pair normalised by its own off slot (off = 1, on = on/off), so bands of
    different step times weigh alike: ``relative_change`` is the mean step change and
    ``t_test`` its CI, as fractions (0.01 = +1%)."""
    return summarize_pairs([1.0] * len(pairs), [p.ratio for p in pairs], unit="x")


@dataclass(frozen=True)
class Overlap:
    """How much of I2's decode runs beside a successor's host build and beside its
    import + warm-up in the decode process (fractions of the decode's wall)."""

    host_build: float
    import_warmup: float
    source: str

    def __post_init__(self) -> None:
        for name in ("host_build", "import_warmup"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise BadRequestError(f"overlap fraction {name} {value!r} is not in [0, 1]")

    def to_json(self) -> dict[str, Any]:
        return {
            "host_build": self.host_build,
            "import_warmup": self.import_warmup,
            "source": self.source,
        }


def _capacity(label: str) -> int:
    return int(label.split("@")[1].split("x")[0])


def campaign_overlap(bench: Mapping[str, Any], source: str) -> Overlap | None:
    """The overlap fractions of the split I2 runs in a bench results document (medians
    over runs), or None if it has none. Per run: the successors' (every graph above the
    first rung) host build = their ready cost minus their import + warm-up, which is
    their background seconds minus their compile; each over the decode's wall (first
    token to last)."""
    host: list[float] = []
    imports: list[float] = []
    for run in bench.get("runs", []):
        if run.get("protocol") != "I2" or not str(run.get("variant", "")).endswith("-split"):
            continue
        labels = list(run["ready_cost_s"])
        if not labels:
            continue
        first = min(_capacity(label) for label in labels)
        later = [label for label in labels if _capacity(label) > first]
        import_s = run["compile_background_s"] - sum(run["compile_s_by_graph"][g] for g in later)
        host_s = sum(run["ready_cost_s"][g] for g in later) - import_s
        wall = run["critical_path_s"] - run["time_to_first_token_s"]
        if wall <= 0:
            continue
        host.append(min(1.0, max(0.0, host_s / wall)))
        imports.append(min(1.0, max(0.0, import_s / wall)))
    if not host:
        return None
    return Overlap(statistics.median(host), statistics.median(imports), source)


@dataclass(frozen=True)
class Implied:
    """I2's expected decode cost: each load's step change times its overlap fraction,
    summed; ``low``/``high`` take every CI's lower/upper end."""

    change: float
    low: float
    high: float


def implied_cost(build: PairedSummary, import_: PairedSummary | None, overlap: Overlap) -> Implied:
    parts = [(build, overlap.host_build)]
    if import_ is not None:
        parts.append((import_, overlap.import_warmup))
    return Implied(
        change=sum(s.relative_change * f for s, f in parts),
        low=sum(s.t_test.ci_low * f for s, f in parts),
        high=sum(s.t_test.ci_high * f for s, f in parts),
    )


def _p_text(summary: PairedSummary) -> str:
    """The sign-flip p; a Monte-Carlo p with no draw as extreme as its 95% bound (3/draws)."""
    flip = summary.sign_flip
    if not flip.is_exact and flip.p_value * (flip.samples + 1) <= 1.0 + 1e-9:
        return f"< {3.0 / flip.samples:.0e}"
    return f"{flip.p_value:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _loads(document: Mapping[str, Any]) -> dict[str, list[SlotPair]]:
    return {
        name: [SlotPair.from_json(row) for row in entry["pairs"]]
        for name, entry in document["loads"].items()
    }


def render(document: Mapping[str, Any]) -> str:
    config = document["config"]
    loads = _loads(document)
    summaries = {name: summarize_load(p) for name, p in loads.items() if len(p) >= 2}
    split = config["split"]
    before = ", ".join(f"{x:.2f}" for x in document["load_before"])
    after = ", ".join(f"{x:.2f}" for x in document["load_after"])
    lines = [
        "# What host-core work costs the split's decode (issue 11)",
        "",
        "Generated by `python tools/bench_overlap.py` from "
        "`docs/benchmarks/results/overlap.json`; do not edit by hand.",
        "",
        *(
            f"- {line}"
            for line in _implication(document, summaries)[-1:]
            + [
                f"{name}: step change {_pct(s.relative_change)}, 95% CI "
                f"[{_pct(s.t_test.ci_low)}, {_pct(s.t_test.ci_high)}]."
                for name, s in summaries.items()
            ]
        ),
        "",
        "```sh",
        str(document["command"]),
        "```",
        "",
        f"- One process decodes one request with I1's graphs ({config['model']}, ladder "
        f"{','.join(map(str, config['ladder']))}, {config['prompt_tokens']}-token prompt, "
        f"{config['new_tokens']} teacher-forced tokens; every rung loaded up front, graphs "
        f"kept between decodes), its decode thread on device core(s) {split['device']}; a "
        f"background process on host core(s) {split['host']} runs one load and is stopped "
        f"and continued (SIGSTOP/SIGCONT) every {config['slot_steps']} steps from the "
        "decode's per-step callback, slots off, on, on, off, ... .",
        f"- {config['decodes']} decodes per load, loads interleaved decode by decode. A pair "
        "is two adjacent slots in one band of one decode (on/off or off/on alternately); "
        "its change is on/off − 1 of the slots' median steps, so the machine's drift, "
        "common to both slots, cancels. 95% CI: paired t over the pairs; p: two-sided "
        "sign-flip (Monte-Carlo, 100 000 seeded draws, above 40 pairs).",
        f"- Loads: {', '.join(config['loads'])}. build = `Compiler.build` of decode@"
        + ", decode@".join(str(c) for c in config["ladder"][1:])
        + " into a fresh store, over and over (the host's work under the split); import = "
        "importing one stored decode blob over and over (the decode-side half of an I2 "
        "load, here in its own process on the host core); memcpy = a 64 MiB numpy copy "
        "loop (the positive control: DRAM traffic).",
        f"- Machine: {document['environment']} Load average (1, 5, 15 min) {before} before and "
        f"{after} after; wall {document['wall_s'] / 60:.1f} min.",
        "",
        "| load | pairs | median step off ms | median step on ms | step change [95% CI] | "
        "p | background busy while on |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, pairs in loads.items():
        entry = document["loads"][name]
        busy = entry["background_cpu_s"] / entry["on_s"] if entry["on_s"] > 0 else 0.0
        if name not in summaries:
            lines.append(f"| {name} | {len(pairs)} | – | – | too few pairs | – | {busy:.0%} |")
            continue
        s = summaries[name]
        lines.append(
            f"| {name} | {s.n_pairs} | {statistics.median(p.off_ms for p in pairs):.3f} | "
            f"{statistics.median(p.on_ms for p in pairs):.3f} | {_pct(s.relative_change)} "
            f"[{_pct(s.t_test.ci_low)}, {_pct(s.t_test.ci_high)}] | "
            f"{_p_text(s)} | {busy:.0%} |"
        )
    lines += ["", "## Can the measurement see a slowdown?", ""]
    control = summaries.get(CONTROL_LOAD)
    if control is None:
        lines.append(
            f"The positive control ({CONTROL_LOAD}) was not run: nothing shows the "
            "measurement can see a slowdown."
        )
    elif control.t_test.ci_low > 0:
        lines.append(
            f"Yes: the {CONTROL_LOAD} loop slows the step by {_pct(control.relative_change)}, "
            f"CI [{_pct(control.t_test.ci_low)}, {_pct(control.t_test.ci_high)}], clear of 0."
        )
    else:
        lines.append(
            f"**No: the measurement is blind.** The {CONTROL_LOAD} loop's CI "
            f"[{_pct(control.t_test.ci_low)}, {_pct(control.t_test.ci_high)}] does not "
            "exclude 0, so the other rows cannot show that a load is harmless."
        )
    lines += ["", "## What it implies for I2", ""]
    lines += _implication(document, summaries)
    return "\n".join(lines) + "\n"


def _implication(document: Mapping[str, Any], summaries: Mapping[str, PairedSummary]) -> list[str]:
    raw = document.get("overlap")
    if raw is None:
        return [
            "No overlap fractions were available (no split I2 runs in the bench "
            "results, none given): the figures above are per overlapping step only."
        ]
    overlap = Overlap(float(raw["host_build"]), float(raw["import_warmup"]), str(raw["source"]))
    build = summaries.get("build")
    if build is None:
        return ["The build load was not measured: nothing to imply."]
    implied = implied_cost(build, summaries.get("import"), overlap)
    used = "build and import" if "import" in summaries else "build only"
    return [
        f"In I2 under the split a successor's host build overlaps "
        f"{100 * overlap.host_build:.0f}% of the decode's wall and its import + warm-up in "
        f"the decode process {100 * overlap.import_warmup:.0f}% ({overlap.source}).",
        f"Weighting each load's step change by its overlap ({used}): I2's decode costs "
        f"**{_pct(implied.change)}** against I1's, between {_pct(implied.low)} and "
        f"{_pct(implied.high)} at the CIs' ends. The issue asks for I2's decode within 2% "
        f"of I1's: {_verdict(implied)}",
    ]


def _verdict(implied: Implied) -> str:
    if abs(implied.low) <= 0.02 and abs(implied.high) <= 0.02:
        return "by this measurement it is, CI ends included."
    if implied.low > 0.02 or implied.high < -0.02:
        return "by this measurement it is not, CI ends included."
    return "not established: a CI end is outside ±2%."
