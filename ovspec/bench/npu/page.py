"""Renders the NPU-plugin results document into docs/benchmarks/npu-plugin.md (under the
device/host split) or npu-plugin-shared-cores.md: per case, each figure's medians per
arm, ovspec's paired ratio to each genai arm with its 95% interval, and a verdict the
interval's bound decides (``common.verdicts``). Pure (no OpenVINO): every figure is
recomputed from the saved runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ovspec.bench.common.verdicts import Interval, Verdict, at_most, paired_ratio
from ovspec.bench.npu.runner import (
    CACHED_REFERENCE_ARM,
    OVSPEC_ARM,
    OVSPEC_WARM_ARM,
    PAGE,
    REFERENCE_ARM,
    SHARED_CORES_PAGE,
)
from ovspec.bench.speed.stats import band_ms

COMMAND = "python tools/bench_npu.py"
GENAI_ARMS = (REFERENCE_ARM, "genai-npu-pyramid", CACHED_REFERENCE_ARM)
OVSPEC_ARMS = (OVSPEC_ARM, OVSPEC_WARM_ARM)
# (ovspec arm, genai arm) compared: cold against genai's up-front compile, warm (a primed
# store) against genai with a primed CACHE_DIR, and warm against genai uncached (below).
WARM_PAIR = (OVSPEC_WARM_ARM, CACHED_REFERENCE_ARM)
# Compared on the decode rows only: the warm store's decode against genai's at the
# numerics asked for. genai compiles every graph before its prompt, so its decode owes
# nothing to a cold start, while its cached arm imports its CPU subgraphs at the CPU's
# default precision (bf16 on a CPU with bf16: docs/npu.md).
WARM_UNCACHED_PAIR = (OVSPEC_WARM_ARM, REFERENCE_ARM)
PAIRS = (
    (OVSPEC_ARM, REFERENCE_ARM),
    (OVSPEC_ARM, "genai-npu-pyramid"),
    WARM_PAIR,
    WARM_UNCACHED_PAIR,
)
DECODE_PREFIX = "decode, "
# ovspec / genai, the 95% interval's upper bound at or under these (issue 27).
FIRST_TOKEN_TARGET = 0.5
RESERVED_KV_TARGET = 0.6
RSS_TARGET = 1.0
DECODE_TARGET = 1.0
# Two ratios this close are one exact figure (reserved KV is computed, not timed).
EXACT_RATIO_RTOL = 1e-9

Metric = Callable[[Mapping[str, Any]], "float | None"]


def genai_kv_tokens(config: Mapping[str, Any]) -> int:
    """genai's reserved KV: NPUW reshapes its generate graph's KV to MAX_PROMPT_LEN +
    MIN_RESPONSE_LEN (each rounded up to 64) and allocates it before the prompt."""
    context = config["genai_context"]
    return int(context["MAX_PROMPT_LEN"]) + int(context["MIN_RESPONSE_LEN"])


def ovspec_kv_tokens(run: Mapping[str, Any], prompt_tokens: int) -> list[int]:
    """The capacity ovspec holds as each token is emitted: the smallest rung it used that
    fits the KV then (the prompt plus the tokens before it and itself)."""
    used = sorted(run["rungs"])
    return [
        next((c for c in used if c >= prompt_tokens + i), used[-1])
        for i in range(len(run["token_ids"]))
    ]


def reserved_mean_tokens(run: Mapping[str, Any], config: Mapping[str, Any]) -> float:
    """Reserved KV tokens, weighted by generated token over the run."""
    if run["arm"] not in OVSPEC_ARMS:
        return float(genai_kv_tokens(config))
    return statistics.fmean(ovspec_kv_tokens(run, config["prompt_tokens"]))


def reserved_peak_tokens(run: Mapping[str, Any], config: Mapping[str, Any]) -> float:
    if run["arm"] not in OVSPEC_ARMS:
        return float(genai_kv_tokens(config))
    return float(max(run["rungs"]))


def ratio_interval(
    runs: Sequence[Mapping[str, Any]], peer: str, metric: Metric, mine: str = OVSPEC_ARM
) -> Interval | None:
    """``mine``'s (an ovspec arm's) ``metric`` over ``peer``'s, paired by repetition: the
    paired-t interval of ``common.verdicts``; a figure that does not vary (computed, not
    timed) is exact, its interval a point (one pair cannot show that a figure does not
    vary). None: fewer than 2 pairs."""
    by_rep: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in runs:
        by_rep.setdefault(int(r.get("repetition", 0)), {})[r["arm"]] = r
    pairs = []
    for reps in by_rep.values():
        if peer in reps and mine in reps:
            a, b = metric(reps[peer]), metric(reps[mine])
            if a and b:
                pairs.append((a, b))
    ratios = [b / a for a, b in pairs]
    if len(ratios) >= 2 and max(ratios) - min(ratios) <= EXACT_RATIO_RTOL * max(ratios):
        return Interval(ratios[0], ratios[0], ratios[0])
    return paired_ratio(pairs)


def _compared(pair: tuple[str, str], label: str) -> bool:
    """Whether ``pair`` is compared on the figure ``label``."""
    return pair != WARM_UNCACHED_PAIR or label.startswith(DECODE_PREFIX)


def _cell(interval: Interval | None) -> str:
    if interval is None:
        return "–"
    if interval.low == interval.high:
        return f"{interval.estimate:.2f}× (exact)"
    return interval.text(2, "×")


def _median(values: Sequence[float | None], digits: int) -> str:
    kept = [v for v in values if v is not None]
    return f"{statistics.median(kept):.{digits}f}" if kept else "–"


def _figures(
    config: Mapping[str, Any],
) -> list[tuple[str, Metric, int, float | None]]:
    """Each figure: its label, its per-run metric, its digits and its target (None:
    shown, no target)."""
    prompt = config["prompt_tokens"]
    out: list[tuple[str, Metric, int, float | None]] = [
        ("spawn → first token (s)", lambda r: float(r["token_s"][0]), 2, FIRST_TOKEN_TARGET),
        # The work before the first token, compiles most of it (both sides run the prompt).
        ("CPU before the first token, every process (s)", _cpu_first_token_s, 2, None),
        (
            "reserved KV, token-weighted (tokens)",
            lambda r: reserved_mean_tokens(r, config),
            0,
            RESERVED_KV_TARGET,
        ),
        ("reserved KV, peak (tokens)", lambda r: reserved_peak_tokens(r, config), 0, None),
        ("peak RSS, VmHWM (MiB)", _peak_rss_mib, 0, RSS_TARGET),
    ]
    # What the bands' means hold beyond the steps: ovspec's decode waiting for a graph
    # still building (genai built all of its before the prompt).
    out.append(("decode waiting for a graph, total (s)", _graph_wait_s, 2, None))
    # Bands the run reached (a case whose answer stops before the top rung has fewer).
    last_live = prompt + config["new_tokens"]
    for lo, hi in (band for band in config["bands"] if band[0] < last_live):
        label = f"{DECODE_PREFIX}{lo}–{hi} live (ms/token)"
        out.append((label, _band_metric(prompt, (lo, hi)), 1, DECODE_TARGET))
    return out


def _cpu_first_token_s(run: Mapping[str, Any]) -> float | None:
    """CPU seconds the run's processes spent from their start to the first token (None:
    a run recorded before this was)."""
    value = run.get("cpu_s_first_token")
    return None if value is None else float(value)


def _peak_rss_mib(run: Mapping[str, Any]) -> float:
    """The arm's VmHWM, plus its host build process's under the split (that memory is on
    the machine too; the two peaks summed may overstate the peak of the sum)."""
    return float(run["vm_hwm_mib"]) + float(run.get("host_vm_hwm_mib", 0.0))


def _graph_wait_s(run: Mapping[str, Any]) -> float:
    """The loader's recorded waits for a graph (the first decode graph after the prompt,
    then a successor at each boundary); none for genai."""
    return float(sum(e["seconds"] for e in run.get("loads", []) if e["kind"] == "wait"))


def _band_metric(prompt_tokens: int, band: tuple[int, int]) -> Metric:
    def metric(run: Mapping[str, Any]) -> float | None:
        return band_ms(run["token_s"], prompt_tokens, band)

    return metric


def _properties_note(properties: Mapping[str, str]) -> str:
    """Why the arms share these properties (results before 2026-12-03 gave NPUW_FOLD=NO)."""
    if "NPUW_FOLD" in properties:
        return (
            "ovspec's NPUW profile's exact ones, so that genai runs the same numerics; on "
            "tests/data/qwen2 genai's tokens were the same with and without them"
        )
    return (
        "f32 on the subdevice and between NPUW's partitions, as in ovspec's NPUW profile's "
        "exact properties, so that genai runs the same numerics; not their `NPUW_FOLD=NO`, "
        "unless a case adds it: with it genai's NPU pipeline fails on the 0.5B preset, in "
        "NPUW's partitioner on the lm_head tied to the embedding. Folding turns f32 "
        "weights into f16; the presets' weights are f16 already"
    )


def _case_properties(config: Mapping[str, Any], shared: Mapping[str, str]) -> str:
    """The sentence naming what a case gives every arm beyond the document's properties."""
    extra = {k: v for k, v in config["properties"].items() if shared.get(k) != v}
    if not extra:
        return ""
    named = ", ".join(f"`{k}={v}`" for k, v in sorted(extra.items()))
    why = ""
    if extra.get("NPUW_FOLD") == "NO":
        why = (
            " (with folding and `NPUW_F16IC=NO`, NPUW crashes ovspec's prefill graphs of "
            "this model: an f32 tensor given to an f16 subgraph input)"
        )
    return f" Every arm of this case also gets {named}{why}."


def render(results: Mapping[str, Any]) -> str:
    """docs/benchmarks/npu-plugin.md."""
    return _render(results, PAGE)


def render_shared_cores(results: Mapping[str, Any]) -> str:
    """docs/benchmarks/npu-plugin-shared-cores.md."""
    return _render(results, SHARED_CORES_PAGE)


def _cores_note(split: Mapping[str, Any] | None, cached: bool = False) -> str:
    """How the arms shared the machine's cores (``cached``: a case ran the warm pair)."""
    if split is None:
        return (
            "Cores: no split, every arm on every core. ovspec one-ahead compiles its next "
            "rung in the background on the cores it decodes on; on silicon the NPU decodes "
            "while the host CPU compiles. Under an emulated split: "
            f"[{PAGE}.md]({PAGE}.md); on shared cores: [{SHARED_CORES_PAGE}.md]"
            f"({SHARED_CORES_PAGE}.md)."
        )
    device = ",".join(str(c) for c in split["device"])
    host = ",".join(str(c) for c in split["host"])
    return (
        f"Cores: an emulated device/host split, device core(s) {device} (the NPU's role: "
        f"inference) and host core(s) {host} (the host CPU's: compiling), the same for every "
        "arm; `INFERENCE_NUM_THREADS` is the device core count in every arm. `genai-npu*`: "
        "the process on the host core(s) while `LLMPipeline` is built (its up-front compile "
        "of the prefill and generate graphs, necessarily in the same process, before the "
        "prompt), then all of it on the device core(s) for the prompt and the decode. "
        + (
            f"`{CACHED_REFERENCE_ARM}` builds its pipeline on the device core(s) too: it "
            "imports from its cache and compiles nothing, and OpenVINO keeps inference "
            "threads on the cores it had when it made their streams (at that import). "
            if cached
            else ""
        )
        + "`ovspec-npu`: `--split`: every graph compiled and exported into the store by a "
        "process on the host core(s), imported in the decode process, whose decode thread "
        "is on the device core(s) and its other threads (the loader's imports) on the host "
        "core(s). Each arm thus gets its host core(s) for compiling and its device core(s) "
        'for inference, as a host CPU beside an NPU would. "decode CPU on the device '
        "cores\": the decode process's CPU time from the first token to the last spent in "
        "threads pinned to the device core(s) then, over all its CPU time then (the rest ran "
        "on the host core(s): ovspec's imports of successors, say). Peak RSS under the "
        "split: the decode process's VmHWM plus its host build process's (their sum, which "
        "may overstate the peak of the two together). The same arms with no "
        "split, every arm on every core: "
        f"[{SHARED_CORES_PAGE}.md]({SHARED_CORES_PAGE}.md)."
    )


def _render(results: Mapping[str, Any], page: str) -> str:
    cases = results["cases"]
    order = results.get("case_order") or sorted(cases)
    properties = ", ".join(f"`{k}={v}`" for k, v in sorted(results["properties"].items()))
    lines = [
        "# The NPU plugin: genai's static pipeline against ovspec's ladder (issue 27)",
        "",
        f"Generated by the command below from `results/{page}.json`; do not edit by hand.",
        "",
        "```sh",
        results.get("command", COMMAND),
        "```",
        "",
        *(_summary(name, cases[name]) for name in order),
        "",
        "Every arm runs the NPU plugin's NPUW partitioner compiling for CPU subdevices "
        "(`--device NPU`, `NPUW_DEVICES=CPU`; no NPU on this machine), on the same IR, "
        "prompt ids and subdevice, a fresh process per run, the arms interleaved with "
        "their order rotated and reversed between repetitions. `genai-npu`: "
        'openvino-genai\'s `LLMPipeline(model, "NPU", NPUW_DEVICES="CPU", '
        "MAX_PROMPT_LEN=…, MIN_RESPONSE_LEN=…)`; `genai-npu-pyramid`: the same with "
        "`NPUW_LLM_GENERATE_PYRAMID=YES`; `ovspec-npu`: ovspec one-ahead on "
        "`--device NPU --config NPUW_DEVICES=CPU` with the device's default load mode "
        "(import: blobs through a store, cold in every run)."
        + _warm_note(cases)
        + f" Properties given to every arm: {properties or 'none'} "
        f"({_properties_note(results['properties'])}). "
        f"Wall time {results['wall_s'] / 60:.1f} min.",
        "",
        _cores_note(
            results.get("split"),
            any(r["arm"] == CACHED_REFERENCE_ARM for c in cases.values() for r in c["runs"]),
        ),
        "",
        "genai is configured for the same maximum context as ovspec's top rung: "
        "`MAX_PROMPT_LEN` is the prompt rounded up to 64 tokens (NPUW's alignment), "
        "`MIN_RESPONSE_LEN` the top rung less that. genai reserves that maximum up front: "
        "NPUW's `LLMCompiledModel` reshapes its generate graph's KV to `MAX_PROMPT_LEN + "
        "MIN_RESPONSE_LEN` (each aligned to 64) and allocates it before the prompt. With the "
        "pyramid it compiles generate graphs for 1K + `MIN_RESPONSE_LEN`, 2K + … up to that "
        "total, the smaller ones sharing the largest's KV tensors: below 1K + the response "
        "there is one graph, the total. genai's reserved KV is therefore that total for "
        "every token. ovspec's is, per generated token, the capacity of the smallest rung "
        "it used (the run's recorded rungs) that holds the KV at that token: its KV "
        "tensors are the rung's (copy-and-grow allocates them at each boundary; remap, "
        "the default where it works, commits the rung's pages of one address range "
        "reserved for the top). Its peak is the largest rung it used. Not counted: the one "
        "throwaway inference that warms a successor compiled ahead (its KV inputs live "
        "for that call only). Reserved KV is computed, not timed: its ratio is exact.",
        "",
        "Ratios are ovspec over each genai arm, the geometric mean of the per-repetition "
        "ratios with a paired-t 95% interval; a target is met only when the interval's "
        "upper bound is at or under it, not met when its lower bound is above it, "
        "otherwise not established (fewer than 2 repetitions: not established).",
        "",
    ]
    for name in order:
        lines += _case(name, cases[name], results["properties"])
    return "\n".join(lines) + "\n"


def _warm_note(cases: Mapping[str, Any]) -> str:
    """The warm pair's sentence, where a case ran it."""
    if not any(WARM_PAIR in _pairs(c["runs"]) for c in cases.values()):
        return ""
    return (
        f" The warm pair: `{CACHED_REFERENCE_ARM}` is `genai-npu` with OpenVINO's "
        "`CACHE_DIR` and "
        f"`{OVSPEC_WARM_ARM}` is `ovspec-npu` with its store, each primed by one "
        "unmeasured run before the repetitions (a user's second start: imports, no "
        "compile); their ratios compare the two warm arms, held to the same targets as "
        "the cold pair's. "
        f"`{OVSPEC_WARM_ARM} / {REFERENCE_ARM}`, on the decode rows only: the warm store's "
        "decode against genai's at the numerics asked for. genai compiles every graph "
        "before its prompt, so its decode owes nothing to a cold start, while "
        f"`{CACHED_REFERENCE_ARM}` imports NPUW's CPU subgraphs at the CPU's default "
        "precision whatever the hint says (bf16 on a CPU with bf16: docs/npu.md)."
    )


def _summary(name: str, case: Mapping[str, Any]) -> str:
    config, runs = case["config"], case["runs"]
    parts = []
    pairs = _pairs(runs)
    for label, metric, _digits, target in _figures(config):
        if target is None:
            continue
        verdicts = [
            at_most(ratio_interval(runs, p, metric, m), target)
            if _compared((m, p), label)
            else None
            for m, p in pairs
        ]
        parts.append(f"{label.split(' (')[0]} ≤ {target:.1f}×: " + _joined(verdicts))
    parts.append(_tokens_summary(runs))
    return f"- `{name}`, {_pairs_label(pairs)}: " + "; ".join(parts) + "."


def _pairs_label(pairs: Sequence[tuple[str, str]]) -> str:
    """``ovspec-npu / (genai-npu | genai-npu-pyramid)`` while every pair is the cold
    arm's (the first format's label), else each pair named."""
    if all(mine == OVSPEC_ARM for mine, _ in pairs):
        return f"{OVSPEC_ARM} / ({' | '.join(p for _, p in pairs)})"
    return "(" + " | ".join(f"{m} / {p}" for m, p in pairs) + ")"


def _pair_header(mine: str, peer: str) -> str:
    return f"ovspec / {peer}" if mine == OVSPEC_ARM else f"{mine} / {peer}"


def _joined(verdicts: Sequence[Verdict | None]) -> str:
    """Each pair's verdict; "–" where the pair is not compared on the figure."""
    return " | ".join(
        "–" if v is None else v.bold() if v is Verdict.MET else v.value for v in verdicts
    )


def _pairs(runs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    present = {r["arm"] for r in runs}
    return [(m, p) for m, p in PAIRS if m in present and p in present]


def _case(name: str, case: Mapping[str, Any], shared: Mapping[str, str]) -> list[str]:
    config, runs = case["config"], case["runs"]
    env = case["environment"]
    arms = [a for a in (*GENAI_ARMS, *OVSPEC_ARMS) if any(r["arm"] == a for r in runs)]
    pairs = _pairs(runs)
    context = config["genai_context"]
    lines = [
        f"## {name}",
        "",
        f"Model `{config['model']}`, a {config['prompt_tokens']}-token prompt "
        f"({config.get('prompt_text', '?')}) then {config['new_tokens']} greedy tokens, "
        f"ladder {config['ladder']}; genai `MAX_PROMPT_LEN={context['MAX_PROMPT_LEN']}`, "
        f"`MIN_RESPONSE_LEN={context['MIN_RESPONSE_LEN']}`; {config['repetitions']} "
        f"repetitions. Machine: {env.get('cpu_model', '?')}, {env.get('usable_cores', '?')} "
        f"cores, OpenVINO {env.get('openvino', '?')}, ovspec at {env.get('git_commit', '?')}."
        + _case_properties(config, shared)
        + (f" Scenario: {config['scenario']}" if config.get("scenario") else ""),
        "",
        "| figure | "
        + " | ".join(arms)
        + " | "
        + " | ".join(f"{_pair_header(m, p)} [95% CI] | verdict" for m, p in pairs)
        + " | target |",
        "|---|" + "---|" * (len(arms) + 2 * len(pairs) + 1),
    ]
    for label, metric, digits, target in _figures(config):
        if not any(metric(r) is not None for r in runs):
            continue  # a figure these runs did not record
        medians = [_median([metric(r) for r in runs if r["arm"] == a], digits) for a in arms]
        cells = []
        for mine, peer in pairs:
            if not _compared((mine, peer), label):
                cells += ["–", "–"]
                continue
            interval = ratio_interval(runs, peer, metric, mine)
            verdict = at_most(interval, target).value if target is not None else "–"
            cells += [_cell(interval), verdict]
        goal = f"≤ {target:.1f}×" if target is not None else "–"
        lines.append(f"| {label} | " + " | ".join([*medians, *cells]) + f" | {goal} |")
    return [*lines, "", *_device_cpu(runs, arms), *_tokens(runs), ""]


def _device_cpu(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[str]:
    """Each arm's median share of its decode's CPU time on the device cores (runs under
    the split only)."""
    shares = []
    for arm in arms:
        mine = [r["decode_cpu_s"] for r in runs if r["arm"] == arm and "decode_cpu_s" in r]
        kept = [c["device"] / (c["device"] + c["other"]) for c in mine if c["device"] + c["other"]]
        if kept:
            shares.append(f"`{arm}` {100 * statistics.median(kept):.0f}%")
    if not shares:
        return []
    return ["Decode CPU on the device cores (median): " + ", ".join(shares) + ".", ""]


def _reference_ids(runs: Sequence[Mapping[str, Any]]) -> list[int]:
    return list(next(r["token_ids"] for r in runs if r["arm"] in GENAI_ARMS))


def _tokens_summary(runs: Sequence[Mapping[str, Any]]) -> str:
    """The summary's token clause: identical, or which arms' runs differ from the first
    genai run's."""
    reference = _reference_ids(runs)
    differ = [
        a
        for a in (*GENAI_ARMS, *OVSPEC_ARMS)
        if any(list(r["token_ids"]) != reference for r in runs if r["arm"] == a)
    ]
    if not differ:
        return "tokens identical: yes"
    named = ", ".join(f"`{a}`" for a in differ)
    return f"tokens identical: **no** ({named} differ from the first genai run's)"


def _tokens(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Full token lists against the first genai run's; the distinct count says whether
    the comparison means anything (a random model may repeat one token)."""
    reference = _reference_ids(runs)
    first = next(r["arm"] for r in runs if r["arm"] in GENAI_ARMS)
    out = []
    for arm in (*GENAI_ARMS, *OVSPEC_ARMS):
        mine = [list(r["token_ids"]) for r in runs if r["arm"] == arm]
        if not mine:
            continue
        same = sum(ids == reference for ids in mine)
        first_diff = min(_first_difference(ids, reference) for ids in mine)
        agree = "all identical" if same == len(mine) else f"first difference at token {first_diff}"
        out.append(
            f"- `{arm}`: {same}/{len(mine)} runs' full token lists equal {first}'s first run's "
            f"({len(reference)} tokens, {len(set(reference))} distinct); {agree}."
        )
    return ["Tokens:", "", *out]


def _first_difference(ids: Sequence[int], reference: Sequence[int]) -> int:
    for i, (a, b) in enumerate(zip(ids, reference, strict=False)):
        if a != b:
            return i
    return min(len(ids), len(reference))
