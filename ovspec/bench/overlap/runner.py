"""The overlap benchmark's measurement: one process decodes with I1's graphs under the
split while background processes (``load``) on the host cores are stopped and
continued slot by slot from the decode's per-step callback; returns the results
document ``analysis.render`` turns into the page.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovspec.bench.common.environment import environment, load_average
from ovspec.bench.overlap.analysis import LOADS, Overlap, SlotPair, pair_slots, slot_on
from ovspec.bench.protocols.setups import SETUPS, Protocol
from ovspec.compile.split import CoreSplit
from ovspec.errors import BadRequestError, OvspecError
from ovspec.ir.model_dir import ModelDir
from ovspec.ladder import Ladder


@dataclass(frozen=True)
class OverlapConfig:
    model: ModelDir
    model_name: str  # as given (builtin:small), for the page
    ladder: Ladder
    prompt_tokens: int
    new_tokens: int
    decodes: int  # per load
    slot_steps: int
    loads: tuple[str, ...]
    split: CoreSplit
    work_dir: Path
    properties: dict[str, str] = field(default_factory=dict)
    device: str = "CPU"
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [name for name in self.loads if name not in LOADS]
        if unknown or not self.loads or len(set(self.loads)) != len(self.loads):
            raise BadRequestError(
                f"loads {list(self.loads)}: give distinct names from {', '.join(LOADS)}"
            )
        if len(self.ladder.capacities_tokens) < 2:
            raise BadRequestError(
                "the ladder needs at least 2 rungs (the build load builds "
                "the successors of the first)"
            )
        if self.decodes < 1 or self.slot_steps < 2:
            raise BadRequestError(
                f"{self.decodes} decodes of {self.slot_steps}-step slots: give at least 1 "
                "decode and 2 steps a slot"
            )
        if self.new_tokens < 2 * self.slot_steps:
            raise BadRequestError(
                f"{self.new_tokens} new tokens do not fill one pair of {self.slot_steps}-step "
                "slots; raise --new-tokens or lower --slot-steps"
            )
        if self.prompt_tokens + self.new_tokens > self.ladder.top_tokens:
            raise BadRequestError(
                f"{self.prompt_tokens} prompt + {self.new_tokens} new tokens exceed the top "
                f"rung {self.ladder.top_tokens}"
            )


class _Background:
    """One load's process (started, then held stopped) and its on-time bookkeeping."""

    def __init__(self, load: str, config: dict[str, Any], scratch: Path) -> None:
        self.load = load
        scratch.mkdir(parents=True)
        path = scratch / "config.json"
        path.write_text(json.dumps({**config, "load": load, "scratch": str(scratch)}))
        # stderr to a file: a pipe nobody reads would fill and stall the load while "on".
        self._stderr = scratch / "stderr.txt"
        with self._stderr.open("w", encoding="utf-8") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ovspec.bench.overlap.load", str(path)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.on_s = 0.0
        self._on_since: float | None = None
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until ready (or the process dies)
        if line.strip() != "ready":
            self.kill()
            tail = self._stderr.read_text(encoding="utf-8").strip().splitlines()[-1:]
            raise OvspecError(
                f"background load {load} did not start: {tail[0] if tail else 'no output'}"
            )
        self.pause()
        self.cpu_at_start_s = self.cpu_s()

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        self._on_since = time.perf_counter()

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        if self._on_since is not None:
            self.on_s += time.perf_counter() - self._on_since
            self._on_since = None

    def cpu_s(self) -> float:
        """CPU seconds the process's threads have run: the scheduler's nanosecond
        counts (procfs ``schedstat``), else user + system time in clock ticks."""
        proc = Path(f"/proc/{self.process.pid}")
        try:
            return (
                sum(
                    int((task / "schedstat").read_text().split()[0])
                    for task in (proc / "task").iterdir()
                )
                / 1e9
            )
        except (OSError, ValueError, IndexError):
            pass
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # the process this object started, by its handle
        self.process.wait()


def _tokens(config: OverlapConfig) -> tuple[list[int], list[int]]:
    vocab = config.model.config.get("vocab_size")
    high = vocab if isinstance(vocab, int) and vocab > 10 else 1000
    rng = np.random.default_rng(config.seed)
    return (
        rng.integers(3, high, config.prompt_tokens).tolist(),
        rng.integers(3, high, config.new_tokens).tolist(),
    )


def _environment_text(load_start: tuple[float, float, float]) -> str:
    env = environment(load_start)
    return (
        f"{env.cpu_model}, {env.usable_cores} usable cores, OpenVINO {env.openvino}, ovspec "
        f"{env.ovspec} at {env.git_commit}, {env.date_utc}."
    )


def run_overlap(
    config: OverlapConfig,
    overlap: Overlap | None,
    on_progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Measure every load of ``config``; the results document (``command`` is the
    caller's to add)."""
    import ovspec.runtime.decoding as runtime
    from ovspec.store.local import Store

    load_start = load_average()
    began = time.perf_counter()
    setup = SETUPS[Protocol.I1]
    prompt, forced = _tokens(config)
    config.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overlap-", dir=config.work_dir) as scratch:
        root = Path(scratch)
        backgrounds: dict[str, _Background] = {}
        with (
            Store(root / "store") as store,
            runtime.open(
                config.model.root,
                ladder=setup.ladder(config.ladder),
                device=config.device,
                properties=config.properties,
                store=store,
                policy=setup.policy,
                load_mode="import",
                tuning=runtime.Tuning(split=config.split),
            ) as loader,
        ):
            # Every rung loaded (I1) and warmed up before any background load starts.
            runtime.decode(
                loader,
                prompt[:8],
                forced_ids=forced[:8],
                kv_layout=setup.kv_layout,
                release_passed_rungs=False,
            )
            load_config = {
                "model_dir": str(config.model.root),
                "device": config.device,
                "properties": loader.properties,
                "capacities": list(config.ladder.capacities_tokens[1:]),
                "host_cores": list(config.split.host),
            }
            try:
                for name in config.loads:
                    on_progress(f"starting the {name} load")
                    backgrounds[name] = _Background(name, load_config, root / name)
                loads = _measure_loads(
                    config, runtime, loader, (prompt, forced), backgrounds, on_progress
                )
            finally:
                for background in backgrounds.values():
                    background.kill()
    return {
        "config": {
            "model": config.model_name,
            "ladder": list(config.ladder.capacities_tokens),
            "prompt_tokens": config.prompt_tokens,
            "new_tokens": config.new_tokens,
            "decodes": config.decodes,
            "slot_steps": config.slot_steps,
            "loads": list(config.loads),
            "split": config.split.to_json(),
            "properties": dict(config.properties),
            "seed": config.seed,
        },
        "loads": loads,
        "overlap": overlap.to_json() if overlap is not None else None,
        "environment": _environment_text(load_start),
        "load_before": list(load_start),
        "load_after": list(load_average()),
        "wall_s": time.perf_counter() - began,
    }


def _measure_loads(
    config: OverlapConfig,
    runtime: Any,
    loader: Any,
    tokens: tuple[list[int], list[int]],
    backgrounds: dict[str, _Background],
    on_progress: Callable[[str], None],
) -> dict[str, Any]:
    """Every decode with each load in turn (the order rotated per repetition); per load
    its slot pairs, decode seconds, time on and CPU seconds."""
    setup = SETUPS[Protocol.I1]
    prompt, forced = tokens
    pairs: dict[str, list[SlotPair]] = {name: [] for name in config.loads}
    decode_s: dict[str, list[float]] = {name: [] for name in config.loads}
    for repetition in range(config.decodes):
        turn = repetition % len(config.loads)
        for name in [*config.loads[turn:], *config.loads[:turn]]:
            found, seconds = _measure(
                runtime,
                loader,
                setup,
                prompt,
                forced,
                config.slot_steps,
                backgrounds[name],
                repetition,
            )
            pairs[name] += found
            decode_s[name].append(seconds)
            on_progress(
                f"decode {repetition + 1}/{config.decodes} with {name}: "
                f"{seconds:.2f} s, {len(found)} pairs"
            )
    loads = {}
    for name, background in backgrounds.items():
        if not background.alive():
            raise OvspecError(f"the {name} load ended during the measurement")
        loads[name] = {
            "pairs": [p.to_json() for p in pairs[name]],
            "decode_s": decode_s[name],
            "on_s": background.on_s,
            "background_cpu_s": background.cpu_s() - background.cpu_at_start_s,
        }
    return loads


def _measure(
    runtime: Any,
    loader: Any,
    setup: Any,
    prompt: Sequence[int],
    forced: Sequence[int],
    slot_steps: int,
    background: _Background,
    repetition: int,
) -> tuple[list[SlotPair], float]:
    """One decode with ``background`` switched slot by slot; its pairs and decode seconds."""
    on_at_step: dict[int, bool] = {}
    state = {"on": False}

    def switch(step: int, _live: int) -> bool:
        if step == 0:  # the prompt's last position: before the first decode step
            return False
        on_at_step[step] = state["on"]  # the state this step ran in
        if step % slot_steps == 0:
            wanted = slot_on(step // slot_steps)
            if wanted != state["on"]:
                (background.resume if wanted else background.pause)()
                state["on"] = wanted
        return False

    try:
        result = runtime.decode(
            loader,
            prompt,
            forced_ids=forced,
            kv_layout=setup.kv_layout,
            release_passed_rungs=False,
            keep_logits=switch,
        )
    finally:
        if state["on"]:
            background.pause()
    steps = [s for s in result.steps if not s.prefill]
    if len(steps) != len(on_at_step):
        raise OvspecError(f"{len(steps)} decode steps but {len(on_at_step)} callbacks")
    found = pair_slots(
        [1e3 * s.infer_s for s in steps],
        [s.capacity_tokens for s in steps],
        [on_at_step[i + 1] for i in range(len(steps))],
        slot_steps,
        decode=repetition,
    )
    return found, sum(s.infer_s for s in steps)
