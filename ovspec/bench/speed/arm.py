"""One run of the speed benchmark in this fresh process:
``python -m ovspec.bench.speed.arm REQUEST.json SPAWN_TIME``.

Owns the arms (openvino-genai's ``LLMPipeline``; ovspec's loader in a given policy and
load mode; llama.cpp on a GGUF, under its own interpreter) and what a run records: the
time of every generated token since the parent spawned this process, the token ids,
the high-water RSS (VmHWM) and the peak PSS and private (RssAnon) memory
(``MemorySampler``), the CPU time every process of the run spent before the first token,
and under a device/host split the decode's CPU time by core set.
Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a split is asked for: genai's arm imports no ovspec
    from ovspec.compile.split import CoreSplit

RESULT_PREFIX = "RESULT "
LOCKSTEP_FD_ENV = "OVSPEC_LOCKSTEP_FD"  # common.lockstep.ENV_FD, read without importing it
GENAI_INTEGER_PROPERTIES = frozenset({"MAX_PROMPT_LEN", "MIN_RESPONSE_LEN"})


@dataclass(frozen=True)
class ArmRequest:
    arm: str  # "genai", "ovspec" or "llamacpp"
    model_dir: str
    prompt_ids: tuple[int, ...]
    new_tokens: int
    properties: dict[str, str]
    ladder: str = ""
    store_dir: str = ""
    policy: str = "one_ahead"
    load_mode: str = ""  # "" = the device's default
    prefill_chunk_tokens: int = 128
    device: str = "CPU"  # both runners' device ("NPU" with NPUW_DEVICES=CPU, say)
    # The emulated device/host split as ``CoreSplit.parse`` reads it ("0/1"); "" none.
    split: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArmRequest:
        return cls(**{**data, "prompt_ids": tuple(data["prompt_ids"])})


class MemorySampler(threading.Thread):
    """Peak PSS and RssAnon of this process. VmHWM counts a shared file page once per
    mapping (a weightless import maps the .bin again); PSS counts it once.

    RssAnon and RssFile come from ``/proc/self/status`` every 50 ms (a cheap read). PSS
    needs ``smaps_rollup``, which walks every page table: read every 50 ms it would take
    a share of a core from the arm being timed, so it is read only when the resident
    set is ``PSS_STEP_MIB`` above its last reading, and at the end."""

    PSS_STEP_MIB = 64.0

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_pss_mib = 0.0
        self.peak_anon_mib = 0.0
        self.pss_reads = 0
        self._rss_at_pss_mib = -self.PSS_STEP_MIB
        self._done = threading.Event()

    def read_pss(self) -> None:
        self.pss_reads += 1
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    self.peak_pss_mib = max(self.peak_pss_mib, int(line.split()[1]) / 1024)

    def sample(self) -> None:
        status = _status_mib_fields("RssAnon", "RssFile", "RssShmem")
        self.peak_anon_mib = max(self.peak_anon_mib, status["RssAnon"])
        rss_mib = sum(status.values())
        if rss_mib >= self._rss_at_pss_mib + self.PSS_STEP_MIB:
            self._rss_at_pss_mib = rss_mib
            self.read_pss()

    def run(self) -> None:
        while not self._done.wait(0.05):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.sample()
        self.read_pss()


def _status_mib_fields(*fields: str) -> dict[str, float]:
    found = dict.fromkeys(fields, 0.0)
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in found:
                found[name] = int(value.split()[0]) / 1024
    return found


def _children_pids() -> list[int]:
    """The pids of this process's live child processes (the split's host build process)."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
        except OSError:
            continue
    return pids


def _children_hwm_mib() -> float:
    """The summed VmHWM of this process's child processes (0 without any)."""
    total = 0.0
    for pid in _children_pids():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) / 1024
        except OSError:
            continue  # it ended meanwhile
    return total


def cpu_s_so_far() -> float:
    """CPU seconds (user + system) spent so far by this process since its exec, by its
    ended children and by its live ones: every process of the run, the split's host build
    process included."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    for pid in _children_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                # utime and stime are fields 14 and 15; the name (2) may hold spaces.
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks_per_s
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
    return total


def _status_mib(field: str) -> float:
    return _status_mib_fields(field)[field]


def _thread_cpu_s() -> dict[int, tuple[float, tuple[int, ...]]]:
    """Thread id -> (CPU seconds so far from its schedstat, its affinity now)."""
    out = {}
    for name in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{name}/schedstat") as f:
                ns = int(f.read().split()[0])
            out[int(name)] = (ns / 1e9, tuple(sorted(os.sched_getaffinity(int(name)))))
        except (OSError, ValueError):  # a thread that just ended
            continue
    return out


def decode_cpu_s(
    before: dict[int, tuple[float, tuple[int, ...]]],
    after: dict[int, tuple[float, tuple[int, ...]]],
    device_cores: tuple[int, ...],
) -> dict[str, float]:
    """This process's CPU seconds between two ``_thread_cpu_s`` readings, split by
    whether the thread was pinned to the device cores only at the second (a thread that
    ended in between is not counted)."""
    out = {"device": 0.0, "other": 0.0}
    for tid, (cpu_s, cores) in after.items():
        spent = cpu_s - before.get(tid, (0.0, ()))[0]
        out["device" if set(cores) <= set(device_cores) else "other"] += spent
    return {k: round(v, 4) for k, v in out.items()}


def _genai(request: ArmRequest, on_token: Any) -> dict[str, Any]:
    split = _split(request)
    if split is not None:  # before OpenVINO starts: its compile on the host cores
        from ovspec.compile.split import pin_process

        # From a primed CACHE_DIR it imports, compiling nothing: on the device cores, as
        # OpenVINO pins its inference threads to the cores it had when it made their
        # streams (at import, here), and re-pinning the process later does not move them.
        pin_process(split.device if request.store_dir else split.host)
    import numpy as np
    import openvino as ov
    import openvino_genai

    # genai's NPU pipeline reads its context sizes as integers (a string is refused).
    properties: dict[str, Any] = {
        k: int(v) if k in GENAI_INTEGER_PROPERTIES else v for k, v in request.properties.items()
    }
    cache_files: set[Path] = set()
    if request.store_dir:  # a kept store: OpenVINO's own cache of the compiled pipeline
        properties["CACHE_DIR"] = request.store_dir
        cache_files = set(Path(request.store_dir).glob("*"))
    pipe = openvino_genai.LLMPipeline(request.model_dir, request.device, **properties)
    # A primed cache gains nothing (a miss would compile, on the device cores here).
    added = len(set(Path(request.store_dir).glob("*")) - cache_files) if request.store_dir else 0
    if split is not None:  # then all of it on the device cores: nothing compiles later
        pin_process(split.device)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = request.new_tokens
    config.ignore_eos = True
    config.do_sample = False
    config.apply_chat_template = False
    ids = np.array(request.prompt_ids, dtype=np.int64)[None]

    class Ids(openvino_genai.StreamerBase):  # type: ignore[misc]
        """Token ids as they come (the built-in models have no detokenizer)."""

        def write(self, token: Any) -> Any:
            for t in token if isinstance(token, list) else [token]:
                on_token(int(t))
            return openvino_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    pipe.generate(inputs, config, streamer=Ids())
    return {"cache_files_added": added} if request.store_dir else {}


def _split(request: ArmRequest) -> CoreSplit | None:
    if not request.split:
        return None
    from ovspec.compile.split import CoreSplit

    return CoreSplit.parse(request.split)


def _ovspec(request: ArmRequest, on_token: Any) -> dict[str, Any]:
    import ovspec.runtime.decoding as runtime
    from ovspec.runtime.options import Tuning
    from ovspec.store.local import Store

    store = Store(Path(request.store_dir))
    try:
        with runtime.open(
            request.model_dir,
            ladder=request.ladder,
            device=request.device,
            properties=request.properties,
            store=store,
            policy=request.policy,
            prefill_chunk_tokens=request.prefill_chunk_tokens,
            load_mode=request.load_mode or None,
            tuning=Tuning(split=_split(request)),
        ) as loader:
            result = runtime.decode(
                loader, request.prompt_ids, max_new_tokens=request.new_tokens, on_token=on_token
            )
            host_hwm_mib = _children_hwm_mib()  # the split's host build process, alive still
    finally:
        store.close()
    return {
        "host_vm_hwm_mib": host_hwm_mib,
        "rungs": list(result.rungs),
        "boundary_wait_s": [b.program_wait_s for b in result.boundaries],
        "loads": [
            {"spec": e.spec, "kind": e.kind.value, "at_s": e.at_s, "seconds": e.seconds}
            for e in result.events
            if e.kind.value in ("compiled", "store_hit", "loaded", "wait", "released")
        ],
    }


def _llamacpp(request: ArmRequest, on_token: Any) -> dict[str, Any]:
    """llama.cpp on the GGUF (``model_dir`` is its path): greedy, every core of this
    process (the binding's default is half of them), the prompt in batches of 512."""
    from llama_cpp import Llama  # type: ignore[import-not-found]

    threads = len(os.sched_getaffinity(0))
    llm = Llama(
        model_path=request.model_dir,
        n_ctx=len(request.prompt_ids) + request.new_tokens,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    greedy = llm.generate(
        list(request.prompt_ids), top_k=1, temp=0.0, repeat_penalty=1.0, reset=True
    )
    for made, token in enumerate(greedy, start=1):
        on_token(int(token))
        if made == request.new_tokens:
            break
    return {"threads": threads}


def _lockstep_reporter() -> Any:
    """Under a lockstep coordinator, its per-token report (a byte on its pipe); else
    None, with nothing imported (genai's arm imports no more of ovspec than it must)."""
    if LOCKSTEP_FD_ENV not in os.environ:
        return None
    from ovspec.bench.common.lockstep import token_reporter

    return token_reporter()


def run(request: ArmRequest, spawn_s: float) -> dict[str, Any]:
    sampler = MemorySampler()
    sampler.start()
    times: list[float] = []
    tokens: list[int] = []
    split = _split(request)
    # Read at the first and the last token (ovspec's loader restores every thread's
    # affinity when it closes, after the last).
    cpu_readings: list[dict[int, tuple[float, tuple[int, ...]]]] = []
    cpu_s_first_token: list[float] = []
    report = _lockstep_reporter()

    def on_token(token: int) -> None:
        times.append(round(time.time() - spawn_s, 5))  # 10 us: well under a step
        tokens.append(token)
        if len(tokens) == 1:  # the work the first token cost: compiles, imports, prompt
            cpu_s_first_token.append(round(cpu_s_so_far(), 4))
        if split is not None and len(tokens) in (1, request.new_tokens):
            cpu_readings.append(_thread_cpu_s())
        if report is not None:
            report()

    if request.arm == "genai":
        extra = _genai(request, on_token)
    elif request.arm == "ovspec":
        extra = _ovspec(request, on_token)
    elif request.arm == "llamacpp":
        extra = _llamacpp(request, on_token)
    else:
        raise SystemExit(f"unknown arm {request.arm!r}")
    done_s = time.time() - spawn_s
    if split is not None and len(cpu_readings) == 2:  # the decode's CPU by core set
        first, last = cpu_readings
        extra["decode_cpu_s"] = decode_cpu_s(first, last, split.device)
    sampler.stop()
    return {
        "ovspec_dir": str(Path(__file__).resolve().parents[2]),  # the checkout it ran from
        "token_s": times,
        "token_ids": tokens,
        "done_s": done_s,
        "vm_hwm_mib": _status_mib("VmHWM"),
        "peak_pss_mib": sampler.peak_pss_mib,
        "peak_anon_mib": sampler.peak_anon_mib,
        "cpu_s_first_token": cpu_s_first_token[0] if cpu_s_first_token else None,
        **extra,
    }


def main(argv: list[str]) -> None:
    request = ArmRequest.from_json(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    result = run(request, float(argv[1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
