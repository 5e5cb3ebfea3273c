"""The scripts in tools/ run their own checkout's ovspec, whatever else is importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
SCRIPTS = sorted(p for p in TOOLS.glob("*.py") if not p.name.startswith("_"))


def test_every_tool_is_checked() -> None:
    assert len(SCRIPTS) >= 7


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_tool_imports_the_ovspec_beside_it(script: Path, tmp_path: Path) -> None:
    """A decoy ovspec ahead of the checkout on the path (as another checkout's editable
    install, or a worktree's tool run with main's environment, would be): the tool
    must not import it. Before tools/_this_checkout.py, a worktree's bench ran main's
    code in every arm and labelled it the worktree's (found in s23)."""
    decoy = tmp_path / "ovspec"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy ovspec was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-600:]
    assert "Usage:" in out.stdout
