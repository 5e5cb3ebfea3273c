"""The store's models/ as upkeep sees it: which model folders ``gc`` and ``clear`` may
remove. A model folder a process uses or is still writing is held (a shared flock on the
folder, ``ovspec.ir.materialize``); it is removed only under an exclusive flock taken
without waiting, so nothing is pulled away under a running generate (issue 29).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from ovspec.store.files import remove_path, scan_folder
from ovspec.store.locks import try_lock_folder
from ovspec.store.opening import STALE_TEMP_S

# gc() deletes model folders under models/ unused for this long (a model folder's
# marker file is touched each time ovspec resolves it: ir.materialize.mark_used); they
# are written again on demand.
MODEL_KEEP_S = 7 * 24 * 3600.0
MODEL_LAST_USED = ".last-used"


def remove_unused(models: Path, cutoff_unix_s: float) -> int:
    """Model folders last used before the cutoff, and half-written ones (a writer's
    staging folder, ``.NAME.*.tmp``) older than a stale temp, unless held. Links are
    never followed."""
    removed = 0
    now = time.time()
    for name, st in scan_folder(models):
        path = models / name
        if not stat.S_ISDIR(st.st_mode):
            continue
        if name.startswith("."):
            stale = st.st_mtime < now - STALE_TEMP_S
        else:
            try:
                marker = os.lstat(path / MODEL_LAST_USED)
                used = marker.st_mtime if stat.S_ISREG(marker.st_mode) else st.st_mtime
            except FileNotFoundError:
                used = st.st_mtime
            stale = used < cutoff_unix_s
        if stale:
            removed += remove_model(path)
    return removed


def remove_model(path: Path) -> bool:
    """Remove a model folder (or a staging one) unless a process holds it. The flock is
    on the folder itself, so removing it under the lock leaves nothing half-gone for a
    later user: one that locks it afterwards finds it unlinked and writes it again."""
    with try_lock_folder(path) as got:
        return got and remove_path(path)


def clear(models: Path) -> None:
    """Every model folder that no process holds, then models/ itself once empty."""
    for name, st in scan_folder(models):
        path = models / name
        if stat.S_ISDIR(st.st_mode):
            remove_model(path)
        else:
            remove_path(path)  # a stray file or a link: removed, never followed
    with contextlib.suppress(OSError):
        os.rmdir(models)  # fails while a held folder is left, as it should
