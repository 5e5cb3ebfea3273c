"""The speed benchmark: ovspec's loader against openvino-genai's ``LLMPipeline`` on the
same IR, device and exact properties, side by side in one run.

Owns the plan (arms, interleaved rounds with the order rotated and reversed, side peers
outside the compared runs, optional warm-ups, a fresh process per run via ``speed.arm``)
and one run's results: every run's token times and ids, memory peaks and loads, kept
whole; ``speed.page`` computes every figure from them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ovspec.bench.speed.arm import RESULT_PREFIX, ArmRequest
from ovspec.compile.split import THREADS_PROPERTY, CoreSplit
from ovspec.errors import BadRequestError, TrialError
from ovspec.ladder import Ladder

PAGE = "speed"
DEFAULT_LADDER = "256,512,1024,2048"


HOST_DEVICE = "CPU"  # where the speed bench runs unless an arm names another device
NPUW_ON_CPU = (("NPUW_DEVICES", HOST_DEVICE),)  # the NPU plugin's NPUW, compiling for the CPU
NPUW_PROMPT_ALIGN_TOKENS = 64  # NPUW rounds MAX_PROMPT_LEN and MIN_RESPONSE_LEN up to this


def npu_context_properties(prompt_tokens: int, ladder: Ladder) -> dict[str, str]:
    """genai's NPU pipeline sized to the ladder's top: the prompt rounded up to NPUW's
    64-token alignment (its prefill graph's length), the rest of the top as the
    response. The pipeline reserves the sum up front (NPUW's generate graph's KV)."""
    max_prompt = -(-prompt_tokens // NPUW_PROMPT_ALIGN_TOKENS) * NPUW_PROMPT_ALIGN_TOKENS
    response = ladder.top_tokens - max_prompt
    if response < NPUW_PROMPT_ALIGN_TOKENS or response % NPUW_PROMPT_ALIGN_TOKENS:
        raise BadRequestError(
            f"the ladder's top {ladder.top_tokens} leaves {response} tokens after a "
            f"{max_prompt}-token prompt: genai's NPU pipeline needs a positive multiple of "
            f"{NPUW_PROMPT_ALIGN_TOKENS}; raise the top rung"
        )
    return {"MAX_PROMPT_LEN": str(max_prompt), "MIN_RESPONSE_LEN": str(response)}


def split_threads(split: str) -> dict[str, str]:
    """The inference threads under ``split``: as many as device cores, as ovspec's loader
    sets under it (``compile.split.THREADS_PROPERTY``)."""
    return {THREADS_PROPERTY: str(len(CoreSplit.parse(split).device))}


@dataclass(frozen=True)
class Arm:
    """One way to generate: genai, or ovspec with a policy, a load mode and a store."""

    name: str
    runner: str  # "genai" | "ovspec"
    store: str = ""  # "fresh" per run, "kept" across runs (primed once), "" (none)
    policy: str = "one_ahead"
    load_mode: str = ""  # "" = the device's default
    # Properties this arm adds to the run's (genai's attention backend, say).
    extra_properties: tuple[tuple[str, str], ...] = ()
    device: str = HOST_DEVICE
    # genai's static NPU pipeline: its context sized to the ladder's top
    # (``npu_context_properties``), as ovspec's largest rung is.
    sized_context: bool = False

    @property
    def description(self) -> str:
        if self.device != HOST_DEVICE:
            return self._device_description()
        if self.runner == "genai" and self.extra_properties:
            extra = ", ".join(f"{k}={v}" for k, v in self.extra_properties)
            return f"openvino-genai LLMPipeline with {extra}, no cache"
        if self.runner == "genai":
            return (
                "openvino-genai LLMPipeline (its default backend; on CPU PagedAttention), no cache"
            )
        if self.runner == "llamacpp":
            return "llama-cpp-python on the GGUF, greedy, its own defaults"
        mode = self.load_mode or "device default"
        store = {"fresh": "cold store", "kept": "warm store"}.get(self.store, "")
        return f"ovspec {self.policy.replace('_', '-')}, load {mode}, {store}"

    def _device_description(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.extra_properties)
        if self.runner == "genai":
            sized = ", MAX_PROMPT_LEN + MIN_RESPONSE_LEN = the ladder's top" * self.sized_context
            cache = "CACHE_DIR primed" if self.store == "kept" else "no cache"
            return f"openvino-genai LLMPipeline on {self.device} ({extra}){sized}, {cache}"
        mode = self.load_mode or "device default"
        store = {"fresh": "cold store", "kept": "warm store"}.get(self.store, "no store")
        policy = self.policy.replace("_", "-")
        return f"ovspec {policy} on {self.device} ({extra}), load {mode}, {store}"


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("genai", "genai"),
        # genai's other CPU backend: the stateful model (SDPA), what `ovspec profile`'s
        # stateful peer is.
        Arm("genai-sdpa", "genai", extra_properties=(("ATTENTION_BACKEND", "SDPA"),)),
        # Rung graphs compiled from the IR (CPU's default until the paged path).
        Arm("ovspec-cold", "ovspec", store="fresh", load_mode="compile"),
        Arm("ovspec-warm", "ovspec", store="kept", load_mode="compile"),
        Arm("ovspec-import-warm", "ovspec", store="kept", load_mode="import"),
        Arm("ovspec-import-cold", "ovspec", store="fresh", load_mode="import"),
        # Every rung compiled before the prompt: its bands are the rungs' own decode,
        # with no successor compiling on the same cores (one-ahead's bands have one).
        Arm("ovspec-eager", "ovspec", store="kept", policy="eager", load_mode="compile"),
        # One PagedAttention graph from the IR, the KV in blocks (CPU).
        Arm("ovspec-paged", "ovspec", store="kept", policy="on_demand", load_mode="paged"),
        # llama.cpp on the GGUF itself (its own interpreter: a benchmark-only build).
        Arm("llama.cpp", "llamacpp"),
        # The NPU plugin's NPUW on CPU subdevices (no NPU here): genai's static pipeline,
        # one generate graph at the top capacity or (pyramid) one per 1K step plus the
        # response; ovspec's ladder with its device default load mode (import, blobs).
        Arm("genai-npu", "genai", extra_properties=NPUW_ON_CPU, device="NPU", sized_context=True),
        Arm(
            "genai-npu-pyramid",
            "genai",
            extra_properties=(*NPUW_ON_CPU, ("NPUW_LLM_GENERATE_PYRAMID", "YES")),
            device="NPU",
            sized_context=True,
        ),
        Arm("ovspec-npu", "ovspec", store="fresh", extra_properties=NPUW_ON_CPU, device="NPU"),
        Arm("ovspec-npu-warm", "ovspec", store="kept", extra_properties=NPUW_ON_CPU, device="NPU"),
        # genai-npu with OpenVINO's own cache (CACHE_DIR, primed by a run before the
        # repetitions): what a user runs instead of a warm store.
        Arm(
            "genai-npu-cached",
            "genai",
            store="kept",
            extra_properties=NPUW_ON_CPU,
            device="NPU",
            sized_context=True,
        ),
    )
}
DEFAULT_ARMS = ("genai", "ovspec-cold", "ovspec-warm", "ovspec-import-warm", "ovspec-eager")
AGAINST_SUFFIX = "@base"  # an ovspec arm run from the checkout given as ``against``


class ArmRun(NamedTuple):
    """An arm as one run of a repetition: its label, and the checkout it runs from
    (None: this one)."""

    label: str
    arm: Arm
    tree: Path | None


@dataclass(frozen=True)
class SpeedConfig:
    model: str  # builtin:PRESET or an IR folder
    work_dir: Path
    ladder: Ladder = field(default_factory=lambda: Ladder.parse(DEFAULT_LADDER))
    prompt_tokens: int = 128
    new_tokens: int = 1000
    repetitions: int = 3
    arms: tuple[str, ...] = DEFAULT_ARMS
    prefill_chunk_tokens: int = 128
    seed: int = 0
    # The prompt's ids (a real text through the model's tokenizer); empty: prompt_tokens
    # random ids drawn with ``seed``.
    prompt_ids: tuple[int, ...] = ()
    # A checkout of ovspec (a git worktree of the base commit, say) whose ovspec arms run
    # beside this one's in every repetition, labelled ARM@base: a change against its
    # base and genai, interleaved in one run.
    against: Path | None = None
    # The interpreter with llama-cpp-python installed (the llama.cpp arm runs under it).
    llamacpp_python: Path | None = None
    # Side peers: arms shown beside the ratios but in none of them, run only in the first
    # ``side_repetitions`` repetitions (all when None) and never between a repetition's
    # genai and ovspec runs.
    side_arms: tuple[str, ...] = ()
    side_repetitions: int | None = None
    # A discarded run of every arm without a kept store (``WARM_UP_NEW_TOKENS`` tokens)
    # before the repetitions: no arm's first measured run is its first read of the files.
    warm_up: bool = False
    # An emulated device/host split ("0/1", ``CoreSplit.parse``) every arm runs under;
    # "": none, every arm on every core.
    split: str = ""

    def __post_init__(self) -> None:
        if self.prompt_ids:
            object.__setattr__(self, "prompt_tokens", len(self.prompt_ids))
        if self.prompt_tokens < 1 or self.new_tokens < 2:
            raise BadRequestError("--prompt-tokens must be >= 1 and --new-tokens >= 2")
        if self.prompt_tokens + self.new_tokens > self.ladder.top_tokens:
            raise BadRequestError(
                f"{self.prompt_tokens} + {self.new_tokens} tokens exceed the top rung "
                f"{self.ladder.top_tokens}"
            )
        if self.repetitions < 1:
            raise BadRequestError("--repetitions must be at least 1")
        if self.split:
            CoreSplit.parse(self.split)  # refused here, not in every arm's process
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not any(ARMS[a].runner == "genai" for a in self.arms):
            raise BadRequestError(
                f"--arms takes a genai arm plus any of {', '.join(ARMS)} "
                f"(got {', '.join(self.arms)})"
            )
        if "llama.cpp" in self.arms and not (
            self.model.endswith(".gguf") and self.llamacpp_python is not None
        ):
            raise BadRequestError("the llama.cpp arm needs a .gguf model and llamacpp_python")
        if self.against is not None and not (self.against / "ovspec" / "__init__.py").is_file():
            raise BadRequestError(
                f"--against {self.against}: not a checkout of ovspec (no ovspec/__init__.py)"
            )

    def runs(self) -> list[ArmRun]:
        """Every arm from this checkout, then each ovspec arm from ``against``."""
        own = [ArmRun(a, ARMS[a], None) for a in self.arms]
        if self.against is None:
            return own
        base = [r for r in own if r.arm.runner == "ovspec"]
        return own + [ArmRun(r.label + AGAINST_SUFFIX, r.arm, self.against) for r in base]

    def bands(self) -> list[tuple[int, int]]:
        """Live-context bands: the prompt to the first rung, then rung to rung."""
        edges = [self.prompt_tokens, *[c for c in self.ladder if c > self.prompt_tokens]]
        return list(itertools.pairwise(edges))


WARM_UP_NEW_TOKENS = 2


def run_order(labels: Sequence[str], rep: int, side: Sequence[str] = ()) -> list[str]:
    """Repetition ``rep``'s order: the compared arms (``labels`` not in ``side``) rotated
    by ``rep // 2`` and reversed on odd repetitions, so each comes first and last alike
    (two arms: ABBA; rotating by ``rep`` would undo the reversal and keep one first);
    the side arms after them on even repetitions, before them on odd ones."""
    pair = [x for x in labels if x not in side]
    turn = rep // 2 % len(pair) if pair else 0
    order = pair[turn:] + pair[:turn]
    rest = [x for x in labels if x in side]
    if rep % 2:
        return rest + order[::-1]
    return order + rest


def materialize(model: str, work_dir: Path) -> Path:
    """An IR folder both runners read: the folder itself, or the preset written once."""
    from ovspec.ir.model_dir import resolve_model

    return resolve_model(model, work_dir / "models").root


def compile_own_bytecode(tree: Path | None = None) -> bool:
    """Compile ovspec's modules to bytecode (this checkout's, or ``tree``'s), as ``pip
    install .`` does: openvino and genai come compiled, and an editable checkout run with
    ``PYTHONDONTWRITEBYTECODE`` would compile every module from source in every spawned
    arm, a start-up cost genai's arm does not pay. False where the package folder is not
    writable."""
    import compileall

    here = Path(__file__).resolve().parents[2]  # ovspec/, from ovspec/bench/speed/runner.py
    package = tree / "ovspec" if tree is not None else here
    return bool(compileall.compile_dir(package, quiet=2))


def arm_module(home: Path) -> str:
    """The arm's module in the checkout at ``home``: one from before the benchmarks had
    their own folders holds it at ovspec/bench/speed_arm.py (``against`` may be one)."""
    if (home / "ovspec" / "bench" / "speed" / "arm.py").is_file():
        return "ovspec.bench.speed.arm"
    return "ovspec.bench.speed_arm"


def _spawn(
    request: ArmRequest, folder: Path, tree: Path | None = None, python: Path | None = None
) -> dict[str, Any]:
    path = folder / "request.json"
    path.write_text(json.dumps(request.to_json()), encoding="utf-8")
    # ``-m`` puts the working folder first on sys.path: run in ``tree`` (default: the
    # folder holding this ovspec) and its ovspec wins over any other checkout or install
    # (PYTHONPATH would lose to one in the caller's working folder).
    home = (tree or Path(__file__).resolve().parents[3]).resolve()
    spawn = time.time()
    out = subprocess.run(
        [str(python or sys.executable), "-m", arm_module(home), str(path), repr(spawn)],
        capture_output=True,
        text=True,
        cwd=home,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith(RESULT_PREFIX)), None)
    if out.returncode != 0 or line is None:
        raise TrialError(f"{request.arm} run failed (exit {out.returncode}): {out.stderr[-800:]}")
    result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
    ran = result.get("ovspec_dir")  # absent from checkouts older than the field
    if ran is not None and Path(ran) != home / "ovspec":
        raise TrialError(f"{request.arm} ran ovspec from {ran}, not {home / 'ovspec'}")
    return result


def arm_request(
    config: SpeedConfig,
    properties: Mapping[str, str],
    arm: Arm,
    model_dir: Path,
    prompt: Sequence[int],
    store: Path | None,
) -> ArmRequest:
    """What one run of ``arm`` is asked to do (its properties, model and store)."""
    from ovspec.runtime.decoding import loader_properties

    own = arm.runner == "genai" or arm.load_mode == "paged"  # no loader thread
    asked = {**properties, **dict(arm.extra_properties)}
    props = asked if own else loader_properties(arm.device, asked)
    if arm.sized_context:
        props.update(npu_context_properties(len(prompt), config.ladder))
    if config.split and arm.runner == "genai":  # ovspec's loader bounds its own
        props.update(split_threads(config.split))
    gguf = arm.runner == "llamacpp"  # llama.cpp reads the GGUF itself
    return ArmRequest(
        arm=arm.runner,
        model_dir=str(Path(config.model).resolve() if gguf else model_dir),
        prompt_ids=tuple(prompt),
        new_tokens=config.new_tokens,
        properties=props,
        ladder=str(config.ladder),
        store_dir=str(store or ""),
        policy=arm.policy,
        load_mode=arm.load_mode,
        prefill_chunk_tokens=config.prefill_chunk_tokens,
        device=arm.device,
        split=config.split,
    )


def run_speed(
    config: SpeedConfig,
    properties: Mapping[str, str],
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every arm ``repetitions`` times, interleaved; returns the results document."""
    from ovspec.bench.common.environment import environment, load_average

    say = on_progress or (lambda _m: None)
    own_bytecode = compile_own_bytecode()
    if config.against is not None:
        compile_own_bytecode(config.against)
    load_start = load_average()
    began = time.perf_counter()
    # Absolute: the arms run in their checkout's folder (``_spawn``).
    work_dir = config.work_dir.resolve()
    model_dir = materialize(config.model, work_dir)
    rng = np.random.default_rng(config.seed)
    prompt = config.prompt_ids or tuple(
        int(t) for t in rng.integers(100, 2000, config.prompt_tokens)
    )
    planned = config.runs()
    kept = {r.label: work_dir / f"store-{r.label}" for r in planned if r.arm.store == "kept"}
    by_label = {r.label: r for r in planned}

    def request(arm: Arm, store: Path | None) -> ArmRequest:
        return arm_request(config, properties, arm, model_dir, prompt, store)

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ovspec-speed-") as scratch:
        folder = Path(scratch)
        _prime_and_warm_up(config, by_label, kept, request, folder, say)
        labels = list(by_label)
        side = [x for x in labels if x in config.side_arms]
        for rep in range(config.repetitions):
            skip = config.side_repetitions is not None and rep >= config.side_repetitions
            order = run_order([x for x in labels if not (skip and x in side)], rep, side)
            for label in order:
                arm, tree = by_label[label].arm, by_label[label].tree
                fresh = folder / f"fresh-{rep}-{label}"
                store: Path | None = kept.get(label) or (fresh if arm.store == "fresh" else None)
                say(f"repetition {rep + 1}/{config.repetitions}: {label}")
                python = config.llamacpp_python if arm.runner == "llamacpp" else None
                result = _spawn(request(arm, store), folder, tree, python)
                shutil.rmtree(fresh, ignore_errors=True)
                runs.append({"arm": label, "repetition": rep, **result})
    env = environment(load_start)
    return {
        "config": {
            "model": config.model,
            "ladder": str(config.ladder),
            "prompt_tokens": config.prompt_tokens,
            "new_tokens": config.new_tokens,
            "repetitions": config.repetitions,
            "prefill_chunk_tokens": config.prefill_chunk_tokens,
            "side_arms": list(config.side_arms),
            "side_repetitions": config.side_repetitions,
            "warm_up_new_tokens": WARM_UP_NEW_TOKENS if config.warm_up else 0,
            "own_bytecode": own_bytecode,
            # A list, not a mapping: the saved results sort mapping keys.
            "arms": [
                [r.label, r.arm.description + (f", from {r.tree}" if r.tree else "")]
                for r in planned
            ],
            "against": str(config.against) if config.against is not None else None,
            "properties": dict(properties),
            "bands": config.bands(),
            "split": CoreSplit.parse(config.split).to_json() if config.split else None,
        },
        "environment": _plain(env),
        "wall_s": time.perf_counter() - began,
        # Per run: token times and ids kept (the bands and the token comparison are
        # recomputable from them).
        "runs": [_slim(run) for run in runs],
    }


def _prime_and_warm_up(
    config: SpeedConfig,
    by_label: Mapping[str, ArmRun],
    kept: Mapping[str, Path],
    request: Callable[[Arm, Path | None], ArmRequest],
    folder: Path,
    say: Callable[[str], None],
) -> None:
    """Prime the kept stores with a full run each (every rung's blob; not measured), and
    with ``warm_up`` give every other arm a short discarded run. A paged arm keeps no
    blobs: with warm-ups on, its short run is all it gets."""
    paged = {x for x in kept if config.warm_up and by_label[x].arm.load_mode == "paged"}
    primed = [x for x in kept if x not in paged]
    for label in primed:
        say(f"priming {label}")
        _spawn(request(by_label[label].arm, kept[label]), folder, by_label[label].tree)
    for label in [x for x in by_label if x not in primed] if config.warm_up else []:
        say(f"warming up {label}")
        arm, tree = by_label[label].arm, by_label[label].tree
        python = config.llamacpp_python if arm.runner == "llamacpp" else None
        scratch = folder / f"warm-up-{label}"
        store = kept.get(label) or (scratch if arm.store == "fresh" else None)
        short = dataclasses.replace(request(arm, store), new_tokens=WARM_UP_NEW_TOKENS)
        _spawn(short, folder, tree, python)
        shutil.rmtree(scratch, ignore_errors=True)


def _slim(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run as saved: every token id kept (a page compares the full lists)."""
    out = dict(run)
    out["tokens"] = len(run["token_ids"])
    return out


def _plain(value: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    """``say`` with every message prefixed (a case's name, say)."""
    return lambda message: say(f"{prefix}: {message}")


def cases_document(
    cases: dict[str, Any], began_s: float, properties: Mapping[str, str], **extra: Any
) -> dict[str, Any]:
    """A results document holding several cases' speed runs, in the order they ran."""
    return {
        **extra,
        "cases": cases,
        "case_order": list(cases),  # the saved document sorts mapping keys
        "wall_s": time.perf_counter() - began_s,
        "properties": dict(properties),
    }
