"""The store's fault campaign: the harness (real processes, canary files, a clean run to
compare with) and the table it prints. The fault classes are ``faults.cases``'s.

Every fault is injected from outside ovspec (files damaged, links planted, a tmpfs
filled, a file size limit, SIGKILL and SIGSTOP, chown) and observed through real
``ovspec`` processes: exit codes, stderr (tracebacks counted), the tokens ``generate``
prints against a clean run's, and a canary folder outside every store that nothing may
touch. ``tools/faults.py`` runs it; docs/benchmarks/reliability.md holds its table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ovspec.builtin import PRESETS, write_model

CLI = (sys.executable, "-c", "from ovspec.cli import main; main()")
LADDER = "32,64"
PROMPT_IDS = "5,6,7"
NEW_TOKENS = 40  # crosses the 32 -> 64 boundary
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Run:
    """One finished process."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    @property
    def tracebacks(self) -> int:
        return self.stderr.count(TRACEBACK) + self.stdout.count(TRACEBACK)

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("ovspec: warning:")]

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("ovspec: error:")]

    def one_line_error(self, code: int = 2) -> bool:
        return self.code == code and len(self.errors) == 1 and self.tracebacks == 0


@dataclass
class Outcome:
    """What one fault class did; filled in by its case."""

    observed: list[str] = field(default_factory=list)
    tokens_equal: bool | None = None  # None: no generate is expected to succeed
    ok: bool = True
    poisoned: int = 0  # entries served wrong after the fault (a later clean run differs)
    notes: list[str] = field(default_factory=list)

    def expect(self, condition: bool, what: str) -> None:
        if not condition:
            self.ok = False
            self.notes.append(what)

    def tokens(self, equal: bool) -> None:
        self.tokens_equal = equal if self.tokens_equal is None else (self.tokens_equal and equal)
        self.expect(equal, "tokens differ from the clean run")


@dataclass(frozen=True)
class FaultResult:
    fault: str
    expected: str
    observed: str
    tokens_equal: bool | None
    outside_untouched: bool
    tracebacks: int
    poisoned: int
    ok: bool
    seconds: float

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def snapshot(folder: Path) -> dict[str, str]:
    """Path -> kind, mode, mtime and content hash of everything below ``folder``."""
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        digest = ""
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(folder))] = f"{st.st_mode:o} {st.st_mtime_ns} {digest}"
    return out


class Harness:
    """The shared pieces: a model, a clean run, a warm store, canaries, process runs."""

    def __init__(self, work: Path, prepare: Callable[[Harness], None] | None = None) -> None:
        self.work = work
        self.runs: list[Run] = []
        self.model = write_model(PRESETS["tiny"], work / "model")
        self.outside = work / "outside"
        self.outside.mkdir(exist_ok=True)
        (self.outside / "canary.txt").write_text("must not be touched\n")
        self._stores = 0
        warm = work / "warm"
        done = self.run("build", str(self.model), "--ladder", LADDER, "--cache-dir", str(warm))
        if done.code != 0:
            raise RuntimeError(f"the warm build failed: {done.stderr.strip()}")
        self.warm = warm
        clean = self.generate(self.new_store("clean"))
        if clean is None:
            raise RuntimeError("the clean run failed")
        self.clean_tokens = clean
        keys = self.run(
            "build", str(self.model), "--ladder", LADDER, "--json", "--cache-dir", str(warm)
        )
        self.keys = {e["specialization"]: e["key"] for e in json.loads(keys.stdout)["entries"]}
        if prepare is not None:
            prepare(self)  # before any row snapshots the outside folder

    # -- processes --------------------------------------------------------------------

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        file_size_limit: int | None = None,
        timeout_s: float = 300.0,
    ) -> Run:
        def limit() -> None:
            if file_size_limit is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

        argv = (*CLI, *args)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, **(env or {})},
                preexec_fn=limit if file_size_limit is not None else None,
                check=False,
            )
            result = Run(tuple(args), done.returncode, done.stdout, self.redact(done.stderr))
        except subprocess.TimeoutExpired as exc:
            result = Run(tuple(args), -9, str(exc.stdout or ""), f"timed out after {timeout_s} s")
        self.runs.append(result)
        return result

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            (*CLI, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def finish(
        self, proc: subprocess.Popen[str], args: Sequence[str], timeout_s: float = 300
    ) -> Run:
        out, err = proc.communicate(timeout=timeout_s)
        result = Run(tuple(args), proc.returncode, out, self.redact(err))
        self.runs.append(result)
        return result

    def redact(self, text: str) -> str:
        """Store paths out of messages: the table shows what happened, not where."""
        return re.sub(re.escape(str(self.work)) + r"/[^\s:;,)]*", "STORE", text)

    def generate_args(self, root: Path, model: Path | None = None) -> list[str]:
        return [
            "generate", str(model or self.model), "--ids", PROMPT_IDS,
            "--max-new-tokens", str(NEW_TOKENS), "--ladder", LADDER, "--ignore-eos",
            "--json", "--cache-dir", str(root),
            "--load-mode", "import",  # through the store (CPU compiles from the IR otherwise)
        ]  # fmt: skip

    def generate(
        self, root: Path, *, env: dict[str, str] | None = None, extra: Sequence[str] = ()
    ) -> list[int] | None:
        done = self.run(*self.generate_args(root), *extra, env=env)
        return tokens_of(done)

    def check(self, root: Path, *, fix: bool = False) -> Run:
        return self.run("cache", "check", *(["--fix"] if fix else []), "--cache-dir", str(root))

    # -- stores -------------------------------------------------------------------------

    def new_store(self, name: str) -> Path:
        self._stores += 1
        return self.work / "stores" / f"{self._stores:02d}-{name}"

    def warm_copy(self, name: str) -> Path:
        root = self.new_store(name)
        shutil.copytree(self.warm, root, symlinks=True)
        return root

    def settle(self, root: Path, outcome: Outcome) -> Run:
        """After a fault: a plain run must serve clean tokens (no manual repair), and the
        store must check clean (after at most one ``check --fix``). Returns that run."""
        first = len(self.runs)
        tokens = self.generate(root)
        run = self.runs[first]
        if tokens != self.clean_tokens:
            outcome.poisoned += 1
        outcome.tokens(tokens == self.clean_tokens)
        if self.check(root).code != 0:
            self.check(root, fix=True)
            outcome.expect(self.check(root).code == 0, "cache check still fails after --fix")
        return run


def tokens_of(done: Run) -> list[int] | None:
    if done.code != 0:
        return None
    try:
        document = json.loads(done.stdout)
        ids: list[int] = document["token_ids"]
    except (ValueError, KeyError):
        return None
    if document.get("load_mode") != "import":  # the campaign tests the store's path
        raise AssertionError(
            f"generate loaded {document.get('load_mode')!r}, not through the store"
        )
    return ids


def payloads(root: Path) -> list[Path]:
    return sorted((root / "blobs").glob("*/*.blob"))


def summarize(runs: Sequence[Run]) -> str:
    codes = ",".join(str(r.code) for r in runs)
    warned = sorted({w.removeprefix("ovspec: warning: ")[:110] for r in runs for w in r.warnings})
    errors = sorted({e.removeprefix("ovspec: error: ")[:110] for r in runs for e in r.errors})
    text = f"exit {codes}"
    if warned:
        text += f"; {len(warned)} kinds of warning (e.g. {warned[0]!r})"
    if errors:
        text += f"; error {errors[0]!r}"
    return text


# -- running the campaign ------------------------------------------------------------

Case = Callable[[Harness], Outcome]


@dataclass(frozen=True)
class FaultCase:
    name: str
    expected: str
    run: Case


def run_campaign(
    work: Path,
    cases: Sequence[FaultCase],
    on_result: Callable[[FaultResult], None] | None = None,
    prepare: Callable[[Harness], None] | None = None,
) -> list[FaultResult]:
    harness = Harness(work, prepare)
    results: list[FaultResult] = []
    for case in cases:
        before = snapshot(harness.outside)
        first = len(harness.runs)
        began = time.perf_counter()
        try:
            outcome = case.run(harness)
        except Exception as exc:  # a harness failure is a failed row, not a lost campaign
            outcome = Outcome(ok=False, notes=[f"the case itself failed: {exc!r}"])
        runs = harness.runs[first:]
        untouched = snapshot(harness.outside) == before
        tracebacks = sum(r.tracebacks for r in runs)
        observed = "; ".join(outcome.observed) or summarize(runs)
        if outcome.notes:
            observed += " — FAILED: " + "; ".join(outcome.notes)
        result = FaultResult(
            fault=case.name,
            expected=case.expected,
            observed=observed,
            tokens_equal=outcome.tokens_equal,
            outside_untouched=untouched,
            tracebacks=tracebacks,
            poisoned=outcome.poisoned,
            ok=outcome.ok and untouched and tracebacks == 0 and outcome.poisoned == 0,
            seconds=time.perf_counter() - began,
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "**NO**")


def format_table(results: Sequence[FaultResult]) -> list[str]:
    lines = [
        "| fault | expected | observed | tokens = clean | outside untouched | tracebacks | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [
            r.fault,
            r.expected,
            r.observed.replace("|", "\\|"),
            _yes_no(r.tokens_equal),
            _yes_no(r.outside_untouched),
            str(r.tracebacks),
            "yes" if r.ok else "**NO**",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def totals(results: Sequence[FaultResult]) -> str:
    differ = sum(r.tokens_equal is False for r in results)
    touched = sum(not r.outside_untouched for r in results)
    tracebacks = sum(r.tracebacks for r in results)
    poisoned = sum(r.poisoned for r in results)
    failed = sum(not r.ok for r in results)
    return (
        f"{len(results)} fault classes: {differ} with outputs that differ from a clean run, "
        f"{touched} that touched files outside the store, {tracebacks} tracebacks, "
        f"{poisoned} poisoned entries, {failed} not as expected"
    )


@contextlib.contextmanager
def mounted(args: Sequence[str], where: Path) -> Iterator[bool]:
    """``mount ARGS where``; yields whether it worked (needs root), unmounts after."""
    where.mkdir(parents=True, exist_ok=True)
    ok = (
        os.geteuid() == 0
        and shutil.which("mount") is not None
        and subprocess.run(
            ["mount", *args, str(where)], capture_output=True, check=False
        ).returncode
        == 0
    )
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
