"""Issue 10, item 10: a lock holder that is stopped (SIGSTOP) no longer blocks a
waiter forever. The holder is a real process; the waiter runs in another, so a
waiter that hangs fails the test by its timeout instead of hanging the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_local import make_key

from ovspec.store.local import Store

HOLDER = r"""
import sys, time
from pathlib import Path
from ovspec.store.locks import KeyLock
lock = KeyLock(Path(sys.argv[1]))
assert lock.acquire(blocking=False)
print("held", flush=True)
time.sleep(600)
"""

WAITER = r"""
import json, sys, warnings
from pathlib import Path
from ovspec.errors import StoreError
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.local import ProducedBlob, Store

root, strict, seed = sys.argv[1], sys.argv[2] == "strict", sys.argv[3]
key = BlobKey.from_values({n: f"{seed}-{n}" for n in COMPONENT_NAMES})

def produce(path):
    path.write_bytes(b"w" * 100)
    return ProducedBlob(compile_s=0.1, size_bytes=100)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        with Store(root, strict=strict) as store:
            out = store.get_or_create(key, produce)
            result = {"stored": out.stored, "hit": out.hit, "wait_s": out.wait_s}
            out.discard()
    except StoreError as exc:
        result = {"error": str(exc)}
print(json.dumps({**result, "warnings": [str(w.message) for w in caught]}))
"""


@pytest.fixture
def stopped_holder(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A store whose key 'stopped' is locked by a process that is then SIGSTOPped."""
    root = tmp_path / "store"
    Store(root).close()
    lock_path = root / "locks" / f"{make_key('stopped').hex}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        yield root, holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)


def wait_in_a_process(root: Path, mode: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", WAITER, str(root), mode, "stopped"],
        capture_output=True,
        text=True,
        timeout=120,  # a waiter that blocks forever fails here
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_stopped_holder_is_named_and_the_waiter_goes_on(stopped_holder: tuple[Path, int]) -> None:
    root, pid = stopped_holder
    # The default policy gives a stopped holder 10 s; a short wait bound is set here so
    # the test is quick (the stopped rule is the one that fires first either way).
    result = wait_in_a_process(root, "lenient", {"OVSPEC_LOCK_WAIT_S": "3"})
    assert result["stored"] is False  # compiled outside the store, without the lock
    warned = " ".join(map(str, result["warnings"]))  # type: ignore[call-overload]
    assert f"process {pid} (stopped)" in warned and "OVSPEC_LOCK_WAIT_S" in warned


def test_a_strict_waiter_fails_with_one_line_naming_the_holder(
    stopped_holder: tuple[Path, int],
) -> None:
    root, pid = stopped_holder
    result = wait_in_a_process(root, "strict", {"OVSPEC_LOCK_WAIT_S": "3"})
    assert f"process {pid} (stopped)" in str(result["error"])
    assert "\n" not in str(result["error"])


def test_a_running_holder_is_waited_for(tmp_path: Path) -> None:
    """A holder that is running (compiling) keeps the waiter waiting, then it hits."""
    from ovspec.store.locks import KeyLock

    store = Store(tmp_path / "store", strict=True)
    key = make_key("running")
    lock = KeyLock(store.root / "locks" / f"{key.hex}.lock")
    assert lock.acquire(blocking=False)
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(store.root), "strict", "running"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OVSPEC_LOCK_WAIT_S": "60"},
    )
    time.sleep(0.5)  # the waiter is blocked on our lock meanwhile (or not started yet)
    assert waiter.poll() is None
    lock.release()
    out, _ = waiter.communicate(timeout=60)
    assert "error" not in json.loads(out)
    store.close()
