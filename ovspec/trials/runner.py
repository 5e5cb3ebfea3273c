"""The A/B compile-trial workflow: run each planned compile in a fresh worker process
of its arm, in counterbalanced order, and append every run to the results file
(``records``), resuming where an earlier invocation stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.compile.worker import (
    ERROR_KINDS,
    WORKER_MODULE,
    WorkerRequest,
)
from ovspec.errors import BadRequestError, TrialError, arg
from ovspec.trials.records import (
    EnvironmentGuard,
    PlannedRun,
    ResultsFile,
    RunRecord,
    TrialPlan,
)


@dataclass(frozen=True)
class RunEvent:
    """Progress: ``record`` just landed; ``done`` of ``total`` runs are recorded."""

    record: RunRecord
    done: int
    total: int


@dataclass(frozen=True)
class TrialProgress:
    """Where a trial stands after ``run_trial``: the recorded runs and what is missing."""

    records: tuple[RunRecord, ...]
    ran: int  # runs made by this invocation
    total: int  # runs in the plan
    missing: frozenset[tuple[int, str, str]]  # planned runs not recorded yet

    @property
    def done(self) -> int:
        return self.total - len(self.missing)

    @property
    def complete(self) -> bool:
        return not self.missing


def _package_folder(root: Path) -> Path:
    """A folder exposing only the harness's ``ovspec`` package (for PYTHONPATH).

    Putting the package's parent on PYTHONPATH could expose everything installed
    beside it (site-packages, with the harness's own openvino) to the other arm.
    """
    folder = root / "pythonpath"
    folder.mkdir()
    package = Path(__file__).resolve().parents[1]  # ovspec/trials/runner.py -> ovspec/
    (folder / "ovspec").symlink_to(package, target_is_directory=True)
    return folder


def _run_worker(
    plan: TrialPlan, planned: PlannedRun, package: Path, scratch: Path
) -> dict[str, Any]:
    arm = plan.arm(planned.arm)
    who = f"arm {arm.arm.value} ({arm.label})"
    request = WorkerRequest(
        xml_path=str(plan.model.xml_path),
        phase=planned.spec.phase.value,
        capacity_tokens=planned.spec.capacity_tokens,
        chunk_tokens=planned.spec.chunk_tokens,
        device=plan.device,
        properties=dict(arm.properties),
        blob_path=str(scratch / f"{planned.arm.value}.blob"),
    )
    # -s: no user site-packages, so an arm's openvino is only what it names.
    argv = [str(arm.python), "-s", "-m", WORKER_MODULE]
    try:
        done = subprocess.run(
            argv,
            input=request.to_json(),
            env=arm.process_env(os.environ, package),
            cwd=package,  # sys.path[0] for -m: a stray ./ovspec must not shadow ours
            capture_output=True,
            text=True,
            timeout=plan.timeout_s,
            check=False,
        )
    except OSError as exc:
        raise BadRequestError(f"{who} cannot start {arm.python}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TrialError(
            f"{who} compile of {planned.spec.label} (pair {planned.pair}) took longer than "
            f"the run timeout {plan.timeout_s:g} s; raise {arg('timeout_s')}"
        ) from exc
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    result: Any = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    if not isinstance(result, dict):
        errors = [line for line in done.stderr.splitlines() if line.strip()]
        last = errors[-1].strip() if errors else "no output"
        raise TrialError(
            f"{who} worker ({arm.python}) exited {done.returncode} without a result: {last}"
        )
    if not result.get("ok"):
        make = ERROR_KINDS.get(str(result.get("kind")), TrialError)
        raise make(f"{who}: {result.get('message', 'the worker failed without a message')}")
    if done.returncode != 0:
        raise TrialError(f"{who} worker exited {done.returncode} after reporting success")
    return result


def run_trial(
    plan: TrialPlan,
    results_path: Path,
    *,
    max_runs: int | None = None,
    scratch_dir: Path | None = None,
    on_run: Callable[[RunEvent], None] | None = None,
) -> TrialProgress:
    """Run every planned compile not yet in ``results_path``, appending each as it lands.

    Stops after ``max_runs`` new runs when given (the trial resumes on the next call).
    A run whose environment differs from its arm's earlier runs is refused before it
    is recorded, with a ``TrialError`` naming the field.
    """
    if max_runs is not None and max_runs < 1:
        raise BadRequestError(f"{arg('max_runs', str(max_runs))} must be at least 1")
    results = ResultsFile(results_path, plan.header(), plan.identity())
    records = results.load()
    guard = EnvironmentGuard()
    for record in records:
        guard.admit(record)
    schedule = plan.schedule()
    recorded = {r.key for r in records}
    todo = [p for p in schedule if p.key not in recorded]
    ran = 0
    if todo:
        with tempfile.TemporaryDirectory(prefix="ovspec-ab-", dir=scratch_dir) as tmp:
            package = _package_folder(Path(tmp))
            for planned in todo:
                if max_runs is not None and ran >= max_runs:
                    break
                result = _run_worker(plan, planned, package, Path(tmp))
                record = RunRecord.from_worker(planned, result)
                guard.admit(record)
                results.append(record)
                records.append(record)
                recorded.add(record.key)
                ran += 1
                if on_run is not None:
                    on_run(RunEvent(record, len(schedule) - len(todo) + ran, len(schedule)))
    missing = frozenset(p.key for p in schedule) - recorded
    return TrialProgress(records=tuple(records), ran=ran, total=len(schedule), missing=missing)


def measured_records(
    plan: TrialPlan, records: Sequence[RunRecord]
) -> dict[tuple[int, str, str], RunRecord]:
    """The plan's measured runs by key (warm-up and runs beyond ``plan.pairs`` left out)."""
    wanted = {p.key for p in plan.schedule() if not p.warmup}
    found = {r.key: r for r in records if r.key in wanted}
    missing = sorted(wanted - set(found))
    if missing:
        pair, label, arm = missing[0]
        raise TrialError(
            f"the trial is incomplete: {len(missing)} run(s) missing, the first pair {pair} "
            f"{label} arm {arm}; rerun the same command to continue it"
        )
    return found
