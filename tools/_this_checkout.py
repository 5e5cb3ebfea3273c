"""Imported first by every tool here: this checkout's ovspec goes ahead of an installed
one. A script's folder (tools/) is first on sys.path, not the checkout, so an editable
install of another checkout (a worktree's tools run with main's venv) would win."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))
