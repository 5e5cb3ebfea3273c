"""One bench run in a fresh process: ``python -m ovspec.bench.protocols.worker REQUEST.json``.

A fresh interpreter per run keeps compile figures honest (no warm OpenVINO state,
no compiled graphs shared between protocols) and makes peak RSS the run's own. The
worker teacher-forces the request's tokens through one protocol and writes the
figures (JSON), the timeline (steps and loader events) and boundary logits (npz).
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ovspec.errors import OvspecError

if TYPE_CHECKING:  # imported in run(), after the split is set up
    from ovspec.runtime.autopolicy import Decision
    from ovspec.runtime.decoding import DecodeResult


@dataclass(frozen=True)
class RunRequest:
    model_dir: str
    ladder: str
    protocol: str
    variant: str
    repetition: int
    prompt_ids: tuple[int, ...]
    forced_ids: tuple[int, ...]
    logit_positions: tuple[int, ...]  # live-token counts whose logits are kept
    device: str
    properties: dict[str, str]
    store_dir: str
    prefill_chunk_tokens: int
    out_json: str
    out_logits: str
    # The device/host split as {"device": [...], "host": [...]}; None: shared cores.
    split: dict[str, list[int]] | None = None
    load_mode: str = "import"
    compression: str = "none"
    auto_costs: dict[str, Any] | None = None  # the auto protocol's (AutoCosts JSON)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRequest:
        data = dict(data)
        for name in ("prompt_ids", "forced_ids", "logit_positions"):
            data[name] = tuple(data[name])
        return cls(**data)


def run(request: RunRequest) -> dict[str, Any]:
    # Not pinned here: ``open`` pins this (the decode) thread to the device cores and
    # the rest to the host. OpenVINO must start with the whole mask: a thread entering
    # its pool gets the mask OpenVINO started with, so the device core alone would put
    # the threads that build an imported graph back on that core.
    from ovspec.compile.split import CoreSplit

    split = CoreSplit.from_json(request.split) if request.split is not None else None
    # Imports next (interpreter start-up is not compile time). The clock starts when the
    # loader is open (OpenVINO up, the host process started: the host exists before the
    # request, as on an NPU machine), so the foreground includes reading and preparing
    # the model, which every protocol pays.
    import ovspec.runtime.decoding as runtime
    from ovspec.bench.protocols.metrics import compute
    from ovspec.bench.protocols.setups import SETUPS, Protocol
    from ovspec.ladder import Ladder
    from ovspec.runtime.autopolicy import AutoCosts
    from ovspec.runtime.autorun import AutoLoader
    from ovspec.store.local import Store

    setup = SETUPS[Protocol(request.protocol)]
    full_ladder = Ladder.parse(request.ladder)
    positions = set(request.logit_positions)
    with (
        Store(request.store_dir) as store,
        runtime.open_rungs(
            request.model_dir,
            ladder=setup.ladder(full_ladder),
            device=request.device,
            properties=request.properties,
            store=store,
            policy=setup.policy,
            prefill_chunk_tokens=request.prefill_chunk_tokens,
            load_mode=request.load_mode,
            compression=request.compression,
            tuning=runtime.Tuning(
                split=split,
                auto_costs=AutoCosts.from_json(request.auto_costs) if request.auto_costs else None,
            ),
        ) as loader,
    ):
        result = runtime.decode(
            loader,
            request.prompt_ids,
            forced_ids=request.forced_ids,
            kv_layout=setup.kv_layout,
            keep_logits=lambda _step, live: live in positions,
            measure_physical=True,
        )
        roles = loader.roles()
        weights_bytes = loader.weights_bytes
        decision = loader.decision if isinstance(loader, AutoLoader) else None
    peak_rss_bytes = peak_rss()
    figures = compute(
        result,
        protocol=request.protocol,
        variant=request.variant,
        repetition=request.repetition,
        bands_ladder=full_ladder,
        peak_rss_bytes=peak_rss_bytes,
        kv_bytes_per_token=roles.kv_bytes_per_token,
        weights_bytes=weights_bytes,
        split=split.describe() if split is not None else "shared",
        load_mode=request.load_mode,
    )
    # decode() keys logits by step; step i ran with prompt + i live positions after it.
    kept = {len(request.prompt_ids) + step: logits for step, logits in result.logits.items()}
    np.savez_compressed(
        request.out_logits,
        positions=np.array(sorted(kept), dtype=np.int64),
        logits=np.stack([kept[p] for p in sorted(kept)]) if kept else np.zeros((0, 0)),
    )
    return {"figures": figures.to_json(), "timeline": _timeline(result, decision)}


def _timeline(result: DecodeResult, decision: Decision | None) -> dict[str, Any]:
    """What happened, step by step and load by load, with auto's plan beside it."""
    return {
        "steps": [
            [s.live_tokens, s.capacity_tokens, s.began_s, s.infer_s, int(s.prefill)]
            for s in result.steps
        ],
        "reserved_kv": [list(pair) for pair in result.reserved_kv],
        "kv_samples": [
            [s.at_s, s.live_tokens, s.reserved_bytes, s.physical_bytes] for s in result.kv_samples
        ],
        "kv_layout": result.kv_layout,
        "kv_note": result.kv_note,
        "events": [
            {
                "kind": e.kind.value,
                "spec": e.spec,
                "at_s": e.at_s,
                "foreground": e.foreground,
                "seconds": e.seconds,
                "note": e.note,
                "build_s": e.build_s,
            }
            for e in result.events
        ],
        "boundaries": [
            {"at_live_tokens": b.at_live_tokens, "began_s": b.began_s} for b in result.boundaries
        ],
        # auto's schedule and its predictions, beside what the figures measured
        "auto": decision.to_json() if decision is not None else None,
    }


def peak_rss() -> int:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux keeps the
    pre-exec image's high-water mark in it, so a worker would report its parent's peak
    whenever that was higher than its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ovspec.bench.protocols.worker REQUEST.json", file=sys.stderr)
        return 2
    request = RunRequest.from_json(json.loads(Path(argv[0]).read_text()))
    try:
        document = run(request)
    except OvspecError as exc:
        document = {"error": str(exc), "exit_code": exc.exit_code}
        Path(request.out_json).write_text(json.dumps(document))
        print(f"ovspec bench worker: {exc}", file=sys.stderr)
        return exc.exit_code
    Path(request.out_json).write_text(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
