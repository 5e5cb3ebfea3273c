"""Fault classes of the campaign about hostile model input (issue 29): crafted GGUF
headers, model files (nested JSON, a truncated IR), a chat template that would render
for hours, and out-of-range numbers on every command. ``faults.cases`` lists them."""

from __future__ import annotations

import shutil
import time

from ovspec.bench.faults.harness import Harness, Outcome, payloads, snapshot, summarize
from ovspec.testing.hostile import (
    ENDLESS_CHAT_TEMPLATE,
    deeply_nested_json,
    hostile_gguf_headers,
    truncated_ir,
)

# -- hostile model input (issue 29) -------------------------------------------------------


def hostile_gguf(h: Harness) -> Outcome:
    """GGUF headers whose lengths and counts lie (2^62-byte strings, 2^32-1 dimensions,
    arrays nested 5000 deep): doctor, doctor --json and generate, one line each."""
    outcome = Outcome()
    root = h.new_store("hostile-gguf")
    for i, (name, data) in enumerate(hostile_gguf_headers().items()):
        gguf = h.work / f"hostile-{i}.gguf"
        gguf.write_bytes(data)
        for command in (["doctor"], ["doctor", "--json"], ["generate", "--ids", "1,2"]):
            done = h.run(command[0], str(gguf), *command[1:], "--cache-dir", str(root))
            outcome.expect(done.one_line_error(2), f"{name}, {command[0]}: not one line, exit 2")
            outcome.expect(done.stdout == "", f"{name}, {' '.join(command)}: printed output")
    outcome.expect(not list(root.glob("models/gguf-*")), "a model was built from a hostile header")
    outcome.observed.append(
        f"{len(hostile_gguf_headers())} headers x doctor, doctor --json, generate: "
        f"{summarize(h.runs[-3:])}"
    )
    return outcome


def hostile_model_files(h: Harness) -> Outcome:
    """A config.json nested 100,000 deep and an IR cut short, through doctor, build and
    generate: one line each, nothing stored."""
    outcome = Outcome()
    nested = h.work / "model-nested-config"
    shutil.copytree(h.model, nested)
    (nested / "config.json").write_text(deeply_nested_json(), encoding="utf-8")
    cut = truncated_ir(h.model, h.work / "model-truncated-ir")
    root = h.new_store("hostile-files")
    seen = []
    for label, model in (("nested config.json", nested), ("truncated IR", cut)):
        for command in (["doctor"], ["build"], ["generate", "--ids", "1,2"]):
            args = [command[0], str(model), *command[1:], "--ladder", "32"]
            done = h.run(*args, "--cache-dir", str(root))
            outcome.expect(done.one_line_error(2), f"{label}, {command[0]}: not one line, exit 2")
            outcome.expect(done.stdout == "", f"{label}, {command[0]}: printed a report")
        seen.append(f"{label}: {summarize(h.runs[-3:])}")
    outcome.expect(not root.exists() or not payloads(root), "something was stored")
    outcome.observed.append("; ".join(seen))
    return outcome


def endless_chat_template(h: Harness) -> Outcome:
    """A chat template of nested 10^5 x 10^5 loops (it would render for hours): generate
    --chat stops it and says so in one line."""
    outcome = Outcome()
    try:
        from ovspec.testing.gguf import write_gguf

        path = h.work / "endless-chat.gguf"
        gguf = write_gguf("qwen2", path, "F16", seed=3, chat_template=ENDLESS_CHAT_TEMPLATE)
    except ImportError as exc:
        outcome.observed.append(f"skipped: writing a GGUF needs the gguf package ({exc.name})")
        return outcome
    root = h.new_store("endless-chat")
    began = time.perf_counter()
    done = h.run(
        "generate", str(gguf), "--chat", "hi", "--max-new-tokens", "2", "--ladder", "64",
        "--cache-dir", str(root), timeout_s=600,
    )  # fmt: skip
    wall_s = time.perf_counter() - began
    outcome.expect(done.one_line_error(2), "generate --chat: not one line, exit 2")
    stopped = "did not finish within" in done.stderr
    outcome.expect(stopped, "the render was not stopped by its bound")
    outcome.observed.append(f"{summarize([done])}; {wall_s:.0f} s including the GGUF import")
    return outcome


# Values issue 29 found accepted with exit 0, each given to a real process.
OUT_OF_RANGE = {
    "--temperature inf": ["generate", "--temperature", "inf"],
    "--stop-token-id 2^70": ["generate", "--stop-token-id", str(2**70)],
    "--rng-seed 2^70": ["generate", "--rng-seed", str(2**70)],
    "--chunk 10^9": ["generate", "--chunk", str(10**9)],
    "--jobs 10^6": ["build", "--jobs", str(10**6)],
    "--compress int4:7": ["build", "--compress", "int4:7"],
    "--compress int4:99999999999": ["build", "--compress", "int4:99999999999"],
    "--ladder 99999999999": ["build", "--ladder", "99999999999"],
    "--size-limit 10^26G": ["gc", "--size-limit", "1" + "0" * 26 + "G"],
    "--size-limit 1.5": ["gc", "--size-limit", "1.5"],
}


def out_of_range_numbers(h: Harness) -> Outcome:
    outcome = Outcome()
    root = h.warm_copy("out-of-range")
    before = snapshot(root)
    seen = []
    for name, (command, *extra) in OUT_OF_RANGE.items():
        if command == "gc":
            args = ["cache", "gc", *extra]
        elif command == "generate":
            args = [*h.generate_args(root), *extra]
        else:
            args = [command, str(h.model), *extra]
        if "--cache-dir" not in args:
            args += ["--cache-dir", str(root)]
        done = h.run(*args)
        outcome.expect(done.one_line_error(2), f"{name}: not one line, exit 2")
        seen.append(f"{name}: exit {done.code}")
    outcome.expect(snapshot(root) == before, "a refused command changed the store")
    outcome.observed.append("; ".join(seen) + "; store unchanged")
    return outcome
