#!/usr/bin/env python3
"""Where a one-ahead decode on the NPU path (NPUW on CPU subdevices) holds its memory:
a fresh process per arm runs ``ovspec.open`` + ``decode`` while a thread samples
``RssAnon`` and ``RssFile`` (``/proc/self/status``) every 20 ms. Every OpenVINO compile,
export, import and IR read is logged with the memory around it and the longest pause of
that sampling thread inside the call (a call that holds the GIL stalls every Python
thread, the decode loop's too); so are the first token and each weight-page drop. Arms: a
cold store then the same store warm, with the profile's named weights bank and
(``--no-bank``) without. A probe, not a benchmark: one run per arm, no peer; docs/npu.md
reads its output.

    python tools/npuw_memory_timeline.py                     # the 0.5B preset, about 1 min
    python tools/npuw_memory_timeline.py --model builtin:small --events
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _this_checkout  # noqa: F401  (before any ovspec import)
import click

from ovspec.bench.common.records import DEFAULT_MODELS_DIR
from ovspec.cli import tool_errors
from ovspec.errors import OvspecError

PROPERTIES = {"NPUW_DEVICES": "CPU", "INFERENCE_PRECISION_HINT": "f32", "NPUW_F16IC": "NO"}
SAMPLE_S = 0.02


def _status_mib() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":")[0]
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[name] = int(line.split()[1]) / 1024
    return out


def _child(model_dir: str, store: str, ladder: str, prompt: int, new: int, bank: bool) -> None:
    """One arm, in this process: prints one JSON line."""
    import numpy as np
    import openvino as ov

    began = time.perf_counter()
    samples: list[tuple[float, dict[str, float]]] = []
    events: list[dict[str, Any]] = []

    def sample() -> None:
        while True:
            samples.append((time.perf_counter() - began, _status_mib()))
            time.sleep(SAMPLE_S)

    def event(what: str, **extra: float) -> None:
        at = round(time.perf_counter() - began, 3)
        thread = threading.current_thread().name
        events.append({"s": at, "event": what, "thread": thread, **_status_mib(), **extra})

    def pause_s(since: float) -> float:
        """The longest gap between samples (or the call's ends) since ``since``."""
        now = time.perf_counter() - began
        times = [since] + [t for t, _ in samples if t >= since] + [now]
        return max(b - a for a, b in itertools.pairwise(times))

    logged_calls = [(ov.Core, n) for n in ("compile_model", "import_model", "read_model")]
    for owner, name in [*logged_calls, (ov.CompiledModel, "export_model")]:
        real = getattr(owner, name)

        def logged(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            target = args[1] if len(args) > 1 else None
            label = target.get_friendly_name() if isinstance(target, ov.Model) else ""
            event(f"> {_name} {label}".rstrip())
            entered = time.perf_counter() - began
            try:
                return _real(*args, **kwargs)
            finally:
                event(f"< {_name}", pause_s=round(pause_s(entered), 3))

        setattr(owner, name, logged)
    if not bank:  # the control: no bank named, each compiled model keeps its own tensors
        from ovspec.compile.devices.npuw import NpuwProfile

        NpuwProfile.shared_weights_properties = lambda self, digest: {}  # type: ignore[method-assign,assignment]
    threading.Thread(target=sample, daemon=True).start()
    import ovspec
    from ovspec.runtime.decoding import decode
    from ovspec.runtime.residency import WeightPageTrimmer

    real_drop = WeightPageTrimmer.drop

    def logged_drop(self: WeightPageTrimmer) -> int:
        before_mib = _status_mib()["RssFile"]
        advised = real_drop(self)  # the mapping's size, resident or not
        freed_mib = before_mib - _status_mib()["RssFile"]
        event(f"weight-page drop: {advised / 2**20:.0f} MiB advised, RssFile {-freed_mib:+.0f} MiB")
        return advised

    WeightPageTrimmer.drop = logged_drop  # type: ignore[method-assign]
    tokens = 0

    def on_token(_token: int) -> None:
        nonlocal tokens
        tokens += 1
        if tokens == 1:
            event("first token")

    ids = [int(x) for x in np.random.default_rng(0).integers(3, 2000, prompt)]
    with ovspec.open(
        model_dir, ladder=ladder, device="NPU", properties=PROPERTIES, store=store
    ) as loader:
        event("opened")
        decode(loader, ids, max_new_tokens=new, on_token=on_token)
        event("decoded")
        end = _status_mib()
    # The peak is VmHWM (exact); its time, the highest 20 ms sample's.
    peak_s, peak = max(samples, key=lambda s: s[1]["VmRSS"])
    peak = {**peak, "VmRSS": end["VmHWM"]}
    print(json.dumps({"peak_s": round(peak_s, 2), "peak": peak, "end": end, "events": events}))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default="builtin:qwen2.5-0.5b", show_default=True)
@click.option("--ladder", default="128,256", show_default=True)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=96, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--no-bank", is_flag=True, help="Also run both arms with no weights bank named.")
@click.option("--events", is_flag=True, help="Print every arm's compile/import timeline.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw results as JSON.")
@click.option("--child", hidden=True, default=None)
def main(
    model: str,
    ladder: str,
    prompt_tokens: int,
    new_tokens: int,
    no_bank: bool,
    events: bool,
    as_json: bool,
    child: str | None,
) -> None:
    if child is not None:
        args = json.loads(child)
        _child(**args)
        return
    with tool_errors("npuw_memory_timeline"):
        from ovspec.ir.model_dir import resolve_model

        model_dir = str(resolve_model(model, DEFAULT_MODELS_DIR.parent / "npu" / "models").root)
        results: dict[str, Any] = {}
        for bank in [True, False] if no_bank else [True]:
            with tempfile.TemporaryDirectory(prefix="ovspec-npuw-memory-") as store:
                for start in ("cold", "warm"):
                    arm = f"{start}{'' if bank else ', no bank'}"
                    click.echo(f"npuw_memory_timeline: {arm}", err=True)
                    args = dict(
                        model_dir=model_dir,
                        store=store,
                        ladder=ladder,
                        prompt=prompt_tokens,
                        new=new_tokens,
                        bank=bank,
                    )
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", json.dumps(args)],
                        capture_output=True,
                        text=True,
                    )
                    if done.returncode != 0:
                        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                        raise OvspecError(f"the {arm} run failed: {last}")
                    try:
                        results[arm] = json.loads(done.stdout.strip().splitlines()[-1])
                    except (IndexError, ValueError) as exc:
                        raise OvspecError(f"the {arm} run printed no results: {exc}") from exc
    if as_json:
        click.echo(json.dumps(results, indent=1))
        return
    click.echo(f"{model}, ladder {ladder}, {prompt_tokens}-token prompt then {new_tokens} tokens")
    click.echo("arm                 peak RSS (MiB)  at (s)   end RssAnon  end RssFile (MiB)")
    for arm, r in results.items():
        click.echo(
            f"{arm:<18} {r['peak']['VmRSS']:>15.0f} {r['peak_s']:>7.2f} "
            f"{r['end']['RssAnon']:>12.0f} {r['end']['RssFile']:>12.0f}"
        )
        if events:
            for e in r["events"]:
                pause = f", sampler paused {e['pause_s']:.3f} s" if "pause_s" in e else ""
                click.echo(
                    f"    {e['s']:7.2f} s  anon {e['RssAnon']:6.0f}  file {e['RssFile']:6.0f}  "
                    f"{e['event']} ({e['thread']}{pause})"
                )


if __name__ == "__main__":
    main()
