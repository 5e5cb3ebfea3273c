"""The fault classes of the store's campaign, one function each, in the order of the
table in docs/benchmarks/reliability.md. Each injects its fault from outside ovspec and observes
through ``ovspec`` processes (``harness.Harness``); a case says what it saw and whether
that was what the store promises (cache/README.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

from ovspec.bench.faults.harness import (
    LADDER,
    FaultCase,
    Harness,
    Outcome,
    mounted,
    payloads,
    summarize,
    tokens_of,
)
from ovspec.bench.faults.hostile import (
    endless_chat_template,
    hostile_gguf,
    hostile_model_files,
    out_of_range_numbers,
)
from ovspec.bench.faults.remote import (
    remote_credentials,
    remote_disk_full,
    remote_forged_manifest,
    remote_huge_payload,
    remote_paths,
    remote_vocabulary,
)
from ovspec.bench.faults.trust import (
    LINK_LEVELS,
    bad_input,
    clear_during_builtin,
    fifo_key_file,
    fifo_payload,
    foreign_model,
    foreign_store,
    link_target,
    links,
    model_link,
    models_mode,
    models_target,
    read_only_mount,
    small_leaks,
    weights_edited,
)
from ovspec.store.digests import digest_file
from ovspec.store.keys import BlobKey
from ovspec.store.local import Store
from ovspec.testing.disk import fill_disk

# -- payload damage ----------------------------------------------------------------------


def _damage(h: Harness, name: str, damage: str) -> Outcome:
    root = h.warm_copy(name)
    blobs = payloads(root)
    if damage == "swap":
        contents = [p.read_bytes() for p in blobs]
        for path, other in zip(blobs, contents[1:] + contents[:1], strict=True):
            path.write_bytes(other)
    for path in blobs:
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        elif damage == "bit flip":
            flipped = bytearray(path.read_bytes())
            flipped[len(flipped) // 3] ^= 0x04
            path.write_bytes(bytes(flipped))
        elif damage == "zero-length":
            path.write_bytes(b"")
        elif damage == "delete payload":
            path.unlink()
        elif damage == "delete sidecar":
            path.with_suffix(".json").unlink()
    if damage == "delete row":
        db = sqlite3.connect(root / "index" / "index.sqlite3", isolation_level=None)
        db.execute("DELETE FROM entries")
        db.close()
    outcome = Outcome()
    outcome.observed.append(summarize([h.settle(root, outcome)]))
    return outcome


def _damage_case(damage: str, expected: str) -> FaultCase:
    return FaultCase(damage, expected, lambda h: _damage(h, damage.replace(" ", "-"), damage))


REBUILT = "warned, quarantined or dropped, recompiled; exit 0"
DAMAGE_CASES = [
    _damage_case("truncate", REBUILT),
    _damage_case("bit flip", REBUILT),
    _damage_case("zero-length", REBUILT),
    _damage_case("swap", REBUILT + " (payloads swapped between entries)"),
    _damage_case("delete payload", "entry dropped, recompiled; exit 0"),
    _damage_case("delete row", "re-indexed from the sidecar (a hit); exit 0"),
    _damage_case("delete sidecar", "still a hit; `check --fix` rewrites it; exit 0"),
]


# -- index and memo damage ---------------------------------------------------------------


def corrupt_index(h: Harness, how: str) -> Outcome:
    root = h.warm_copy(f"index-{how}")
    db = root / "index" / "index.sqlite3"
    if how == "garbage":
        db.write_bytes(os.urandom(db.stat().st_size))
    elif how == "truncated":
        with open(db, "r+b") as f:
            f.truncate(db.stat().st_size // 3)
    else:
        db.unlink()
        db.mkdir()
    outcome = Outcome()
    run = h.settle(root, outcome)
    outcome.expect(any("rebuilt it from 4 sidecars" in w for w in run.warnings), "no rebuild")
    outcome.observed.append(summarize([run]))
    return outcome


def corrupt_memo(h: Harness) -> Outcome:
    root = h.warm_copy("memo")
    for path in (root / "digests").iterdir():
        path.write_bytes(os.urandom(64))
    (root / "digests" / "0123456789abcdef.json").mkdir()
    outcome = Outcome()
    outcome.observed.append(summarize([h.settle(root, outcome)]) + " (hashed again)")
    return outcome


# -- failed writes -------------------------------------------------------------------


def poisoned_blob(h: Harness) -> Outcome:
    """What a store that did not check an export's length would keep after a short
    export: a truncated payload whose sidecar and row name its truncated size and
    checksum, so it verifies; importing it must quarantine it."""
    root = h.warm_copy("poisoned")
    half = root.parent / "poisoned-half.blob"
    with Store(root, strict=True) as store:
        for entry in store.entries():
            half.write_bytes(entry.path.read_bytes()[: entry.size_bytes // 2])
            size, checksum = half.stat().st_size, digest_file(half)
            short = dataclasses.replace(entry, size_bytes=size, checksum=checksum)
            store.remove(entry.hex)
            store.local.put(BlobKey(entry.components), half, short)
    half.unlink()
    outcome = Outcome()
    before = h.check(root)
    outcome.expect(before.code == 0, "the poison was supposed to verify")
    run = h.settle(root, outcome)
    outcome.expect(any("cannot import" in w for w in run.warnings), "not quarantined")
    outcome.observed.append(summarize([run]))
    return outcome


def file_size_limit(h: Harness) -> Outcome:
    root = h.new_store("rlimit")
    outcome = Outcome()
    prefill = h.run(
        "build", str(h.model), "--ladder", "32", "--phases", "prefill", "--cache-dir", str(root)
    )
    limited = h.run(
        "build",
        str(h.model),
        "--ladder",
        "32",
        "--phases",
        "decode",
        "--cache-dir",
        str(root),
        file_size_limit=100_000,
    )
    outcome.expect(prefill.code == 0, "setup build failed")
    outcome.expect(limited.one_line_error(2), "expected one line and exit 2")
    outcome.expect("File too large" in limited.stderr, "the cause is not named")
    listed = h.run("cache", "ls", "--json", "--cache-dir", str(root))
    outcome.expect(len(json.loads(listed.stdout or "[]")) == 1, "a short blob was stored")
    outcome.observed.append(summarize([limited]) + "; nothing stored")
    h.settle(root, outcome)
    return outcome


def disk_full_export(h: Harness) -> Outcome:
    outcome = Outcome()
    with mounted(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"], h.work / "tmpfs") as ok:
        if not ok:
            outcome.observed.append(
                "skipped: cannot mount a tmpfs here (RLIMIT_FSIZE row covers it)"
            )
            return outcome
        root = h.work / "tmpfs" / "store"
        h.run(
            "build", str(h.model), "--ladder", "32", "--phases", "prefill", "--cache-dir", str(root)
        )
        fill_disk(h.work / "tmpfs", leave_bytes=140_000)
        full = h.run("build", str(h.model), "--ladder", LADDER, "--cache-dir", str(root))
        outcome.expect(full.code == 0, "expected fail-open (exit 0)")
        outcome.expect(any("No space left" in w for w in full.warnings), "no warning")
        outcome.observed.append(summarize([full]) + "; compiled outside, nothing short stored")
        h.settle(root, outcome)
    return outcome


def disk_full_index(h: Harness) -> Outcome:
    outcome = Outcome()
    root = h.warm_copy("index-full")
    saved = {p.name: p.read_bytes() for p in (root / "index").iterdir()}
    with mounted(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"], root / "index") as ok:
        if not ok:
            outcome.observed.append("skipped: cannot mount a tmpfs here")
            return outcome
        for name, data in saved.items():
            (root / "index" / name).write_bytes(data)
        fill_disk(root / "index")
        for blob in payloads(root)[:2]:
            blob.unlink()  # two misses, so commits must write rows
        first = len(h.runs)
        tokens = h.generate(root)
        outcome.tokens(tokens == h.clean_tokens)
        run = h.runs[first]
        outcome.expect(run.code == 0 and run.tracebacks == 0, "expected fail-open")
        strict = h.run("cache", "gc", "--cache-dir", str(root))
        outcome.expect(strict.one_line_error(2), "strict: expected one line, exit 2")
        outcome.observed.append(summarize([run]) + f"; strict gc: {summarize([strict])}")
        (root / "index" / "filler").unlink()
    h.settle(root, outcome)
    return outcome


# -- processes that die, wait, race ----------------------------------------------------


def killed_builds(h: Harness, count: int = 20, seed: int = 10) -> Outcome:
    rng = random.Random(seed)
    root = h.new_store("sigkill")
    outcome = Outcome()
    args = ("build", str(h.model), "--ladder", LADDER, "--cache-dir", str(root))
    for _ in range(count):
        proc = h.start(*args)
        time.sleep(rng.uniform(0.3, 3.5))  # anywhere from start-up to the last compile
        proc.send_signal(signal.SIGKILL)
        h.finish(proc, args)
    listed = h.run("cache", "ls", "--json", "--cache-dir", str(root))
    stored = len(json.loads(listed.stdout or "[]"))
    outcome.observed.append(f"{count} builds killed at random points; {stored} entries survived")
    h.settle(root, outcome)
    return outcome


def concurrent_builders(h: Harness, count: int = 4) -> Outcome:
    root = h.new_store("concurrent")
    outcome = Outcome()
    args = ("build", str(h.model), "--ladder", LADDER, "--json", "--cache-dir", str(root))
    procs = [h.start(*args) for _ in range(count)]
    runs = [h.finish(p, args) for p in procs]
    outcome.expect(all(r.code == 0 for r in runs), "a builder failed")
    misses = sum(json.loads(r.stdout)["totals"]["misses"] for r in runs if r.code == 0)
    outcome.expect(misses == 4, f"{misses} compiles for 4 blobs")
    outcome.observed.append(
        f"{count} builders: exit {','.join(str(r.code) for r in runs)}; "
        f"{misses} compiles for 4 blobs"
    )
    h.settle(root, outcome)
    return outcome


def maintenance_during_generate(h: Harness, max_loops: int = 60) -> Outcome:
    """``cache clear`` and ``cache gc`` (with a limit that evicts) in a loop for as long
    as a ``generate`` runs: entries vanish between its checksums and its imports."""
    root = h.warm_copy("clear-gc-loop")
    outcome = Outcome()
    gen_args = h.generate_args(root)
    gen = h.start(*gen_args)
    loops = 0
    while gen.poll() is None and loops < max_loops:
        if loops % 2:
            h.run("cache", "gc", "--size-limit", "200000B", "--cache-dir", str(root))
        else:
            h.run("cache", "clear", "--yes", "--cache-dir", str(root))
        loops += 1
    run = h.finish(gen, gen_args)
    outcome.tokens(tokens_of(run) == h.clean_tokens)
    outcome.expect(loops >= 2, "the loop did not overlap the generate")
    outcome.observed.append(f"{loops} clear/gc while a generate ran: {summarize([run])}")
    h.run("cache", "gc", "--size-limit", "20G", "--cache-dir", str(root))
    h.settle(root, outcome)
    return outcome


HOLDER = """
import sys, time
from pathlib import Path
from ovspec.store.locks import KeyLock
lock = KeyLock(Path(sys.argv[1]))
assert lock.acquire(blocking=False)
print("held", flush=True)
time.sleep(600)
"""


def stopped_lock_holder(h: Harness) -> Outcome:
    root = h.new_store("sigstop")
    Store(root).close()  # create it (read-only commands such as `cache ls` never do)
    outcome = Outcome()
    lock = root / "locks" / f"{h.keys['prefill@32x32']}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        first = len(h.runs)
        tokens = h.generate(root, env={"OVSPEC_LOCK_WAIT_S": "3"})
        run = h.runs[first]
        outcome.tokens(tokens == h.clean_tokens)
        outcome.expect(
            any(f"process {holder.pid} (stopped)" in w for w in run.warnings),
            "the holder is not named",
        )
        outcome.observed.append(summarize([run]))
    finally:
        holder.kill()
        holder.wait()
    h.settle(root, outcome)
    return outcome


def prepare(h: Harness) -> None:
    """What the campaign makes before its first row: the targets of planted links."""
    for level in LINK_LEVELS:
        link_target(h, level)
    models_target(h)


def _link_case(level: str) -> FaultCase:
    return FaultCase(
        f"link at {level}",
        "refused until repaired; clear/gc/check --fix replace it",
        lambda h: links(h, level),
    )


CASES: list[FaultCase] = [
    *DAMAGE_CASES,
    FaultCase(
        "index: garbage",
        "warned, rebuilt from the sidecars; hits; exit 0",
        lambda h: corrupt_index(h, "garbage"),
    ),
    FaultCase(
        "index: truncated",
        "warned, rebuilt from the sidecars; hits; exit 0",
        lambda h: corrupt_index(h, "truncated"),
    ),
    FaultCase(
        "index: a folder in its place",
        "warned, rebuilt from the sidecars; exit 0",
        lambda h: corrupt_index(h, "folder"),
    ),
    FaultCase("digest memo: garbage", "ignored, files hashed again; exit 0", corrupt_memo),
    FaultCase(
        "poisoned blob (short, verifies)",
        "import fails: quarantined, rebuilt; exit 0",
        poisoned_blob,
    ),
    FaultCase("RLIMIT_FSIZE during export", "one line, exit 2; nothing stored", file_size_limit),
    FaultCase(
        "disk full during export (tmpfs)",
        "warned, compiled outside; nothing stored",
        disk_full_export,
    ),
    FaultCase(
        "disk full under the index (tmpfs)",
        "warned, compiled outside; strict: one line",
        disk_full_index,
    ),
    FaultCase(
        "SIGKILL during build x20", "no entry or a whole one; later runs clean", killed_builds
    ),
    FaultCase("4 concurrent builders", "each blob compiled once; all exit 0", concurrent_builders),
    FaultCase(
        "clear/gc loop during generate",
        "generate unaffected (verified mappings)",
        maintenance_during_generate,
    ),
    FaultCase(
        "lock holder stopped (SIGSTOP)",
        "waiter gives up naming the pid, compiles outside",
        stopped_lock_holder,
    ),
    *[_link_case(level) for level in LINK_LEVELS],
    FaultCase(
        "foreign-owned world-writable store + planted pickle",
        "refused (one line); trusted: read-only, nothing unpickled",
        foreign_store,
    ),
    FaultCase("read-only mount", "reads work; --fix refused in one line", read_only_mount),
    FaultCase(
        "weights edited in place, times restored", "new key; never the old blob", weights_edited
    ),
    FaultCase("bad generate / build input", "one line, exit 2, nothing compiled", bad_input),
    FaultCase("small leaks (.part, folders, binary FORMAT)", "cleaned or one line", small_leaks),
    FaultCase(
        "remote: fetch onto a full disk (tmpfs, RLIMIT_FSIZE)",
        "fails open (tokens clean); pull --json: no_room; RLIMIT_FSIZE: one line, exit 2",
        remote_disk_full,
    ),
    FaultCase(
        "remote: manifest names a payload larger than the disk",
        "not downloaded (free space, size limit); compiled here; tmp/ clean",
        remote_huge_payload,
    ),
    FaultCase(
        "remote: forged manifest (decode@32 -> decode@64's payload)",
        "refused before the commit; a committed one quarantined and rebuilt",
        remote_forged_manifest,
    ),
    FaultCase(
        "remote: manifest widens the vocabulary",
        "ids checked against the model folder: one line, exit 2",
        remote_vocabulary,
    ),
    FaultCase(
        "remote: credentials in the endpoint / remote URL",
        "never shown; --remote with credentials refused in one line",
        remote_credentials,
    ),
    FaultCase("remote: paths in uploaded manifests", "no local path leaves", remote_paths),
    FaultCase(
        "link at models/<name>",
        "refused (one line); check reports, --fix removes; target untouched",
        model_link,
    ),
    FaultCase(
        "model folder owned by another user, weights rewritten",
        "refused (one line); check reports, --fix moves aside; written again",
        foreign_model,
    ),
    FaultCase(
        "clear loop during generate/build of builtin:tiny",
        "generate and build unaffected (model folder held)",
        clear_during_builtin,
    ),
    FaultCase("models/ mode", "made 700; 755 reported, --fix makes it 700", models_mode),
    FaultCase(
        "FIFO at a payload (read-only check)",
        "reported without blocking; --fix moves it",
        fifo_payload,
    ),
    FaultCase("FIFO as the remote key file", "one line, exit 2, no hang", fifo_key_file),
    FaultCase(
        "hostile GGUF headers (2^62-byte string, 2^32-1 dims, nested arrays)",
        "one line, exit 2, nothing built",
        hostile_gguf,
    ),
    FaultCase(
        "hostile model files (config.json nested 100,000 deep, IR cut short)",
        "one line, exit 2, nothing stored",
        hostile_model_files,
    ),
    FaultCase(
        "chat template that loops for hours",
        "stopped at its bound: one line, exit 2",
        endless_chat_template,
    ),
    FaultCase(
        "out-of-range numbers (inf, 2^70, 10^9 chunk, int4:7, unit-less size)",
        "one line, exit 2, store unchanged",
        out_of_range_numbers,
    ),
]
