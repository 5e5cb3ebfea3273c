"""Lockstep runs: several arms' processes loaded side by side and exactly one running at
a time, taking turns in blocks of a few tokens (the order reversed every round: ABBA),
so adjacent blocks of two arms see the same machine state within seconds.

Owns the coordinator (spawn, pause, resume, the block schedule) and the child's side (a
byte per token on an inherited pipe; ``checkpoint`` for arms paused between turns). An
arm is paused with SIGSTOP, not by blocking its token callback: genai calls its streamer
from a worker thread and goes on generating while the callback blocks, so only a stopped
process is surely idle.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ovspec.errors import TrialError

ENV_FD = "OVSPEC_LOCKSTEP_FD"  # the write end of the child's token pipe
SELF_STOP = b"c"  # a unit done by an arm that stops itself (any other byte: a token)
STOP_CONFIRM_S = 2.0  # how long a SIGSTOP may take to show in /proc (microseconds here)
BLOCK_TIMEOUT_S = 900.0  # a block (or a load with its first token) longer than this hangs


def token_reporter() -> Callable[[], None] | None:
    """In a child under a coordinator: a callable to call once per token; else None."""
    fd = os.environ.get(ENV_FD)
    if not fd:
        return None
    out = int(fd)

    def report() -> None:
        os.write(out, b".")

    return report


def checkpoint(idle_s: float = 0.0) -> None:
    """Under a coordinator: stay idle ``idle_s`` (still running alone: work deferred past
    a unit, such as a background compile, gets that time, as a reader's pause gives it),
    then report one unit done (a turn, say) and stop this process at once, so the next
    unit's timing starts only when the coordinator resumes it (a SIGSTOP sent after the
    report could land inside the next unit). Else nothing."""
    fd = os.environ.get(ENV_FD)
    if fd:
        time.sleep(idle_s)
        # "c": the coordinator must not stop it again (a second SIGSTOP, pending when the
        # first lands, would stop it again right after its resume).
        os.write(int(fd), SELF_STOP)
        os.kill(os.getpid(), signal.SIGSTOP)


@dataclass(frozen=True)
class LockstepArm:
    """One arm: its label, and its command given the spawn time (``time.time()``)."""

    label: str
    argv: Callable[[float], Sequence[str]]
    cwd: Path | None = None


@dataclass
class ArmProcess:
    """An arm's process and what the coordinator saw of it; times are ``time.time()``."""

    label: str
    spawn_s: float
    popen: subprocess.Popen[bytes]
    read_fd: int
    stdout_path: Path
    stderr_path: Path
    tokens: int = 0
    done: bool = False
    stops_itself: bool = False  # its last report was a checkpoint
    windows: list[tuple[float, float]] = field(default_factory=list)  # (resume, stop)

    def output(self) -> tuple[str, str]:
        return (
            self.stdout_path.read_text(encoding="utf-8", errors="replace"),
            self.stderr_path.read_text(encoding="utf-8", errors="replace"),
        )


@dataclass(frozen=True)
class LockstepResult:
    """Per arm: its stdout, exit code, spawn time and run windows (relative to its spawn,
    the clock its token times use); the schedule: which arm ran each block, in order."""

    arms: dict[str, dict[str, Any]]
    schedule: list[str]


def round_order(labels: Sequence[str], round_index: int) -> list[str]:
    """Round ``round_index``'s order: as given on even rounds, reversed on odd ones (two
    arms: A B B A A B ...)."""
    return list(labels) if round_index % 2 == 0 else list(labels)[::-1]


def _is_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or the process is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def _stop(proc: ArmProcess) -> None:
    """SIGSTOP and wait until every thread is stopped, so the next arm runs alone."""
    if proc.popen.poll() is not None:
        return
    if not proc.stops_itself:
        os.kill(proc.popen.pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_CONFIRM_S
    while not _is_stopped(proc.popen.pid):
        if time.monotonic() > deadline:
            raise TrialError(f"{proc.label} did not stop within {STOP_CONFIRM_S} s")
        time.sleep(0.0002)


def _run_until(proc: ArmProcess, target_tokens: int) -> None:
    """Let ``proc`` run until it reported ``target_tokens`` tokens or exited."""
    deadline = time.monotonic() + BLOCK_TIMEOUT_S
    while proc.tokens < target_tokens:
        ready, _, _ = select.select([proc.read_fd], [], [], 1.0)
        if ready:
            chunk = os.read(proc.read_fd, 4096)
            if not chunk:  # every write end closed: the process has exited
                proc.popen.wait()
                proc.done = True
                return
            proc.tokens += len(chunk)
            proc.stops_itself = chunk.endswith(SELF_STOP)
        elif proc.popen.poll() is not None:
            proc.done = True
            return
        if time.monotonic() > deadline:
            raise TrialError(f"{proc.label} made no progress in {BLOCK_TIMEOUT_S:.0f} s")


def _spawn(arm: LockstepArm, folder: Path) -> ArmProcess:
    read_fd, write_fd = os.pipe()
    out, err = folder / f"{arm.label}.out", folder / f"{arm.label}.err"
    spawn_s = time.time()
    # Output to files: a stopped reader of a full pipe would block the child.
    with out.open("wb") as stdout, err.open("wb") as stderr:
        popen = subprocess.Popen(
            list(arm.argv(spawn_s)),
            stdout=stdout,
            stderr=stderr,
            cwd=arm.cwd,
            pass_fds=(write_fd,),
            env={**os.environ, ENV_FD: str(write_fd)},
        )
    os.close(write_fd)
    return ArmProcess(arm.label, spawn_s, popen, read_fd, out, err)


def run_lockstep(
    arms: Sequence[LockstepArm],
    block_tokens: int,
    on_progress: Callable[[str], None] | None = None,
) -> LockstepResult:
    """Spawn the arms one after another, each run alone to its first token and stopped;
    then rounds of one block of ``block_tokens`` tokens per arm (``round_order``) until
    every arm has exited. An arm that exits drops out; the others go on in blocks."""
    if block_tokens < 1 or len({a.label for a in arms}) != len(arms) or not arms:
        raise TrialError("a lockstep run needs distinct arms and blocks of at least 1 token")
    say = on_progress or (lambda _m: None)
    procs: list[ArmProcess] = []
    schedule: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ovspec-lockstep-") as scratch:
        try:
            for arm in arms:  # loads and prefills one at a time, each alone
                proc = _spawn(arm, Path(scratch))
                procs.append(proc)
                _run_until(proc, 1)
                _stop(proc)
                say(f"{arm.label} loaded, first token")
            by_label = {p.label: p for p in procs}
            round_index = 0
            while not all(p.done for p in procs):
                for label in round_order([a.label for a in arms], round_index):
                    proc = by_label[label]
                    if proc.done:
                        continue
                    resume_s = time.time()
                    os.kill(proc.popen.pid, signal.SIGCONT)
                    _run_until(proc, proc.tokens + block_tokens)
                    _stop(proc)
                    proc.windows.append((resume_s, time.time()))
                    schedule.append(label)
                round_index += 1
                if round_index % 10 == 0:
                    say(", ".join(f"{p.label} {p.tokens} tokens" for p in procs))
            return LockstepResult({p.label: _arm_record(p) for p in procs}, schedule)
        finally:
            for proc in procs:
                os.close(proc.read_fd)
                if proc.popen.poll() is None:  # only on failure: ours, by pid
                    proc.popen.kill()
                    proc.popen.wait()


def _arm_record(proc: ArmProcess) -> dict[str, Any]:
    stdout, stderr = proc.output()
    return {
        "returncode": proc.popen.returncode,
        "stdout": stdout,
        "stderr_tail": stderr[-800:],
        "spawn_s": proc.spawn_s,
        "windows_s": [
            [round(a - proc.spawn_s, 5), round(b - proc.spawn_s, 5)] for a, b in proc.windows
        ],
    }
