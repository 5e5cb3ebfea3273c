"""What running a store's blobs cost on this machine: per blob key (a rung's decode graph
for one model, device, properties and compression), the decode seconds per token and
import seconds of its last few runs, in ``step-times.json`` beside the store's index.
The ``auto`` policy and ``ovspec plan`` read it so a second run needs no measurement.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovspec.store.files import read_regular_file

FILE_NAME = "step-times.json"
# A shared store is not trusted: a link, FIFO or huge file there is not read.
MAX_FILE_BYTES = 8 << 20
KEPT_RUNS = 5  # per key: the median of the last few runs, so one hiccup does not steer


@dataclass(frozen=True)
class StepTimes:
    """One blob's recorded runs: decode seconds per token and import seconds (medians)."""

    label: str
    decode_s_per_token: float
    import_s: float
    runs: int


def _path(store_root: Path) -> Path:
    return Path(store_root) / FILE_NAME


def _read(store_root: Path) -> dict[str, Any]:
    """The file's records; empty when absent or unreadable (a history, not the store)."""
    try:
        data = json.loads(read_regular_file(_path(store_root), MAX_FILE_BYTES))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_step_times(store_root: Path) -> dict[str, StepTimes]:
    """Every key's step times (key hex -> ``StepTimes``); malformed records are skipped."""
    out: dict[str, StepTimes] = {}
    for hex_, record in _read(store_root).items():
        try:
            decode = [float(v) for v in record["decode_s_per_token"]]
            imports = [float(v) for v in record.get("import_s", [])] or [0.0]
            if decode:
                out[hex_] = StepTimes(
                    str(record.get("label", "")),
                    statistics.median(decode),
                    statistics.median(imports),
                    len(decode),
                )
        except (KeyError, TypeError, ValueError):
            continue
    return out


def record_step_times(store_root: Path, runs: Mapping[str, tuple[str, float, float]]) -> None:
    """Add one run per key (key hex -> (label, decode s per token, import s)), keeping
    each key's last ``KEPT_RUNS``. The file is replaced atomically; two writers at once
    may drop one's run (it is a history, the next run records again)."""
    data = _read(store_root)
    for hex_, (label, decode_s, import_s) in runs.items():
        if not (math.isfinite(decode_s) and decode_s > 0 and math.isfinite(import_s)):
            continue
        found = data.get(hex_)
        old: dict[str, Any] = found if isinstance(found, dict) else {}
        data[hex_] = {
            "label": label,
            "decode_s_per_token": [*old.get("decode_s_per_token", []), decode_s][-KEPT_RUNS:],
            "import_s": [*old.get("import_s", []), max(0.0, import_s)][-KEPT_RUNS:],
            "recorded_unix_s": time.time(),
        }
    path = _path(store_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".step-times-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
