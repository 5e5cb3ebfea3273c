"""Fault classes of the campaign about trust and edges: links planted in the store,
a store another user owns (with a planted pickle), a read-only mount, weights edited in
place, bad input, small leaks, model folders and special files (hostile model input is
``faults.hostile``'s). ``faults.cases`` lists them with the others."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

from ovspec.bench.faults.harness import (
    Harness,
    Outcome,
    mounted,
    snapshot,
    summarize,
    tokens_of,
)

# -- trust: links, other users, read-only ------------------------------------------------

LINK_LEVELS = ("quarantine", "tmp", "locks", "blobs", "blobs/xx", "index")


def plant_link(h: Harness, root: Path, level: str, target: Path) -> None:
    """Replace one of the store's folders by a link to ``target`` (outside every store)."""
    path = root / "blobs" / h.keys["decode@32"][:2] if level == "blobs/xx" else root / level
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.move(str(path), str(h.work / f"moved-{time.monotonic_ns()}"))
    path.symlink_to(target, target_is_directory=True)


def link_target(h: Harness, level: str) -> Path:
    """The folder outside every store that a link at ``level`` points to: canaries named
    like the store's own files, old enough for every age rule. Made once, before any
    row's snapshot of the outside folder."""
    target = h.outside / f"via-{level.replace('/', '-')}"
    target.mkdir(exist_ok=True)
    names = ("x.blob", "x.lock", "index.sqlite3", f"{h.keys['decode@32']}.1.a.blob.part")
    for name in names:
        (target / name).write_text("precious")
        os.utime(target / name, (1, 1))
    return target


def links(h: Harness, level: str) -> Outcome:
    outcome = Outcome()
    target = h.outside / f"via-{level.replace('/', '-')}"
    root = h.warm_copy(f"link-{level.replace('/', '-')}")
    plant_link(h, root, level, target)
    refused = h.run(*h.generate_args(root))
    outcome.expect(refused.one_line_error(2), "generate through a link was not refused")
    seen = []
    for command in (["clear", "--yes"], ["gc"], ["check", "--fix"]):
        plant_link(h, root, level, target)
        repaired = h.run("cache", *command, "--cache-dir", str(root))
        outcome.expect(repaired.code in (0, 1) and repaired.tracebacks == 0, "repair failed")
        outcome.expect(not (root / level).is_symlink(), f"{command[0]} left the link")
        seen.append(f"{command[0]}: exit {repaired.code}")
    outcome.observed.append(f"generate refused (exit {refused.code}, one line); {', '.join(seen)}")
    h.settle(root, outcome)
    return outcome


class _Bomb:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.marker), "ran"))  # type: ignore[return-value]


def foreign_store(h: Harness) -> Outcome:
    outcome = Outcome()
    if os.geteuid() != 0:
        outcome.observed.append("skipped: chown to another user needs root")
        return outcome
    root = h.warm_copy("foreign")
    marker = h.outside / "pwned"
    db = sqlite3.connect(root / "index" / "index.sqlite3", isolation_level=None)
    db.execute("UPDATE entries SET record = ?", (pickle.dumps(_Bomb(str(marker))),))
    db.close()
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    root.chmod(0o777)
    refused = h.run(*h.generate_args(root))
    outcome.expect(refused.one_line_error(2), "a world-writable foreign store was not refused")
    before = snapshot(root)
    trusted = h.run(*h.generate_args(root), "--trust-shared-store")
    outcome.tokens(tokens_of(trusted) == h.clean_tokens)
    outcome.expect(snapshot(root) == before, "the trusted (read-only) store was written")
    outcome.expect(not marker.exists(), "a planted pickle ran")
    outcome.observed.append(
        f"refused: {summarize([refused])}; with --trust-shared-store: {summarize([trusted])}"
        " (planted pickle rows: malformed, ignored)"
    )
    return outcome


def read_only_mount(h: Harness) -> Outcome:
    outcome = Outcome()
    view = h.work / "ro-view"
    with mounted(["--bind", str(h.warm)], view) as ok:
        if (
            not ok
            or subprocess.run(
                ["mount", "-o", "remount,ro,bind", str(view)], capture_output=True, check=False
            ).returncode
            != 0
        ):
            outcome.observed.append("skipped: cannot bind-mount read-only here")
            return outcome
        first = len(h.runs)
        tokens = h.generate(view)
        outcome.tokens(tokens == h.clean_tokens)
        fix = h.check(view, fix=True)
        outcome.expect(fix.one_line_error(2), "check --fix on a read-only store: one line")
        outcome.observed.append(
            f"generate: {summarize(h.runs[first : first + 1])}; check --fix: {summarize([fix])}"
        )
    return outcome


# -- edits and bad input -----------------------------------------------------------------


def weights_edited(h: Harness) -> Outcome:
    outcome = Outcome()
    model = h.work / "model-edited"
    shutil.copytree(h.model, model)
    root = h.new_store("weights")
    args = (
        "build",
        str(model),
        "--ladder",
        "32",
        "--phases",
        "decode",
        "--blob-mode",
        "full",
        "--json",
        "--cache-dir",
        str(root),
    )
    first = json.loads(h.run(*args).stdout)["entries"][0]
    weights = model / "openvino_model.bin"
    st = weights.stat()
    with open(weights, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(os.urandom(256))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = json.loads(h.run(*args).stdout)["entries"][0]
    outcome.expect(second["key"] != first["key"] and not second["hit"], "old blob served")
    a = tokens_of(h.run(*h.generate_args(root, model)))
    b = tokens_of(h.run(*h.generate_args(h.new_store("weights-fresh"), model)))
    outcome.tokens(a is not None and a == b)
    outcome.observed.append(
        "new key after the in-place edit (times restored); a miss, not the old "
        "full blob; tokens = a fresh store's on the edited model"
    )
    return outcome


def bad_input(h: Harness) -> Outcome:
    outcome = Outcome()
    root = h.warm_copy("bad-input")
    base = h.generate_args(root)
    cases = {
        "id = vocab": ["--ids", "5,2048"],
        "huge id": ["--ids", "5,99999999999999999999999"],
        "unknown property": ["--config", "FOO=1"],
        "invalid value": ["--config", "INFERENCE_PRECISION_HINT=f33"],
    }
    seen = []
    for name, extra in cases.items():
        argv = [a for a in base if a not in ("--ids", "5,6,7")] if "--ids" in extra else base
        done = h.run(*argv, *extra)
        outcome.expect(done.one_line_error(2), f"{name}: not one line and exit 2")
        seen.append(f"{name}: exit {done.code}")
    build = h.run(
        "build",
        str(h.model),
        "--ladder",
        "32",
        "--config",
        "NUM_STREAMS=many",
        "--cache-dir",
        str(root),
    )
    outcome.expect(build.one_line_error(2), "build --config: not one line and exit 2")
    outcome.observed.append("; ".join(seen) + f"; build --config: exit {build.code}")
    h.settle(root, outcome)
    return outcome


def small_leaks(h: Harness) -> Outcome:
    outcome = Outcome()
    root = h.warm_copy("leaks")
    hex_ = h.keys["decode@32"]
    part = root / "tmp" / f"{hex_}.4242.deadbeef.blob.part"
    part.write_bytes(b"half")
    h.run("cache", "ls", "--cache-dir", str(root))
    outcome.expect(not part.exists(), ".part of a dead writer kept")
    sidecar = next(root.glob(f"blobs/*/{hex_}.json"))
    sidecar.unlink()
    sidecar.mkdir()
    lock = root / "locks" / f"{hex_}.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    fixed = h.check(root, fix=True)
    outcome.expect(fixed.code == 0, "check --fix could not repair folders in place of files")
    (root / "quarantine" / "a-folder").mkdir()
    clear = h.run("cache", "clear", "--yes", "--cache-dir", str(root))
    outcome.expect(clear.code == 0, "clear failed on a quarantined folder")
    fmt = h.warm_copy("format")
    (fmt / "FORMAT").write_bytes(b"\xff\xfe not text")
    bad = h.run("cache", "ls", "--cache-dir", str(fmt))
    outcome.expect(bad.one_line_error(2), "a binary FORMAT is not one line")
    outcome.observed.append(
        f"stale .part removed on open; check --fix: exit {fixed.code}; "
        f"clear: exit {clear.code}; binary FORMAT: exit {bad.code}"
    )
    h.settle(root, outcome)
    return outcome


# -- models/: folders of built-in models, special files (issue 29) -------------------------

BUILTIN = Path("builtin:tiny")  # generate_args takes a model path; this is its reference


def builtin_store(h: Harness, name: str) -> Path:
    """A new store holding builtin:tiny's model folder and blobs (one generate)."""
    root = h.new_store(name)
    h.run(*h.generate_args(root, BUILTIN))
    return root


def model_folder(root: Path) -> Path:
    return next((root / "models").glob("tiny-*"))


def models_target(h: Harness) -> Path:
    """A model folder outside every store with other weights, for a planted link; made
    once, before any row's snapshot of the outside folder."""
    target = h.outside / "via-models"
    if not target.exists():
        shutil.copytree(h.model, target)
        weights = target / "openvino_model.bin"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
        weights.write_bytes(bytes(data))
    return target


def model_link(h: Harness) -> Outcome:
    outcome = Outcome()
    root = builtin_store(h, "model-link")
    folder = model_folder(root)
    shutil.rmtree(folder)
    folder.symlink_to(models_target(h), target_is_directory=True)
    refused = h.run(*h.generate_args(root, BUILTIN))
    outcome.expect(refused.one_line_error(2), "generate through a link at models/ not refused")
    found = h.check(root)
    outcome.expect(found.code == 1 and "symbolic link" in found.stdout, "check said OK")
    fixed = h.check(root, fix=True)
    outcome.expect(fixed.code == 0 and not folder.is_symlink(), "check --fix left the link")
    tokens = tokens_of(h.run(*h.generate_args(root, BUILTIN)))
    outcome.tokens(tokens == h.clean_tokens)
    outcome.observed.append(
        f"generate refused (exit {refused.code}, one line); check: exit {found.code}; "
        f"check --fix: exit {fixed.code}, link removed; then written again in the store"
    )
    h.settle(root, outcome)
    return outcome


def foreign_model(h: Harness) -> Outcome:
    outcome = Outcome()
    if os.geteuid() != 0:
        outcome.observed.append("skipped: chown to another user needs root")
        return outcome
    root = builtin_store(h, "model-foreign")
    folder = model_folder(root)
    for path in [folder, *folder.iterdir()]:
        os.chown(path, 12345, 12345, follow_symlinks=False)
    weights = folder / "openvino_model.bin"  # what that user can now do
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))
    refused = h.run(*h.generate_args(root, BUILTIN))
    outcome.expect(refused.one_line_error(2), "a foreign model folder was used")
    found = h.check(root)
    outcome.expect(found.code == 1 and "owned by" in found.stdout, "check said OK")
    fixed = h.check(root, fix=True)
    tokens = tokens_of(h.run(*h.generate_args(root, BUILTIN)))
    outcome.tokens(tokens == h.clean_tokens)
    outcome.expect(model_folder(root).stat().st_uid == os.geteuid(), "not written again")
    outcome.observed.append(
        f"generate refused (exit {refused.code}, one line); check: exit {found.code}; "
        f"check --fix: exit {fixed.code}, moved aside; then written again, ours"
    )
    h.settle(root, outcome)
    return outcome


def models_mode(h: Harness) -> Outcome:
    outcome = Outcome()
    root = builtin_store(h, "models-mode")
    made = stat.S_IMODE((root / "models").stat().st_mode)
    outcome.expect(made == 0o700, f"models/ made {made:o}")
    (root / "models").chmod(0o755)
    found = h.check(root)
    outcome.expect(found.code == 1 and "models/ is open" in found.stdout, "check said OK")
    fixed = h.check(root, fix=True)
    after = stat.S_IMODE((root / "models").stat().st_mode)
    outcome.expect(after == 0o700, f"check --fix left models/ {after:o}")
    outcome.observed.append(
        f"made {made:o}; 755 → check: exit {found.code}; check --fix: exit {fixed.code}, {after:o}"
    )
    h.settle(root, outcome)
    return outcome


def clear_during_builtin(h: Harness, rounds: int = 3) -> Outcome:
    """``cache clear`` in a loop while ``generate`` or ``build`` of builtin:tiny runs on a
    fresh store: the model folder is written and read under fire."""
    outcome = Outcome()
    seen = []
    for i in range(rounds):
        root = h.new_store(f"clear-builtin-{i}")
        if i % 2 == 0:
            args = h.generate_args(root, BUILTIN)
        else:
            args = ["build", str(BUILTIN), "--ladder", "32,64", "--cache-dir", str(root)]
        proc = h.start(*args)
        clears = 0
        while proc.poll() is None:
            h.run("cache", "clear", "--yes", "--cache-dir", str(root))
            clears += 1
        run = h.finish(proc, args)
        outcome.expect(run.code == 0, f"{args[0]} under a clear loop: exit {run.code}")
        if args[0] == "generate":
            outcome.tokens(tokens_of(run) == h.clean_tokens)
        seen.append(f"{args[0]}: exit {run.code} ({clears} clears)")
    outcome.observed.append("; ".join(seen))
    return outcome


def fifo_payload(h: Harness) -> Outcome:
    outcome = Outcome()
    root = h.warm_copy("fifo-payload")
    payload = next(root.glob(f"blobs/*/{h.keys['decode@32']}.blob"))
    payload.unlink()
    os.mkfifo(payload)
    found = h.run("cache", "check", "--cache-dir", str(root), timeout_s=60)
    outcome.expect(found.code == 1, f"read-only check: exit {found.code} (-9: hung)")
    fixed = h.check(root, fix=True)
    outcome.expect(fixed.code == 0 and not payload.exists(), "check --fix kept the FIFO")
    outcome.observed.append(
        f"check: exit {found.code} (reported, not opened); check --fix: exit {fixed.code}"
    )
    h.settle(root, outcome)
    return outcome


def fifo_key_file(h: Harness) -> Outcome:
    outcome = Outcome()
    fifo = h.work / "key-fifo"
    if not fifo.exists():
        os.mkfifo(fifo, 0o600)
    root = h.warm_copy("fifo-key")
    remote = ("--remote", "s3://bucket/prefix")
    flag = h.run(*h.generate_args(root), *remote, "--remote-key-file", str(fifo), timeout_s=60)
    env = h.run(
        *h.generate_args(root), *remote, env={"OVSPEC_REMOTE_KEY_FILE": str(fifo)}, timeout_s=60
    )
    for name, run in (("--remote-key-file", flag), ("OVSPEC_REMOTE_KEY_FILE", env)):
        outcome.expect(run.one_line_error(2), f"{name}: exit {run.code} (-9: hung)")
    outcome.observed.append(f"--remote-key-file: exit {flag.code}; env: exit {env.code}")
    return outcome
