"""Issue 29, items 3, 4, 5 and 17: the store's models/ (built-in models written on
demand). A folder there that is a link or another user's is never used (check reports
it, check --fix moves it aside, the model is written again); a model folder a process
uses is not removed by a concurrent clear; models/ is owner-only. Faults come from
outside: real links, real ownership (chown), real concurrent ``ovspec`` processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

CLI = (sys.executable, "-c", "from ovspec.cli import main; main()")
OTHER_UID = 12345
GENERATE = ("--ids", "5,6,7", "--max-new-tokens", "24", "--ladder", "32,64", "--ignore-eos")
GENERATE += ("--load-mode", "import", "--json")
HOLDER = """
import sys, time
from pathlib import Path
from ovspec.ir.model_dir import resolve_model
resolve_model("builtin:tiny", Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def ovspec(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s)


def generate(root: Path) -> subprocess.CompletedProcess[str]:
    return ovspec("generate", "builtin:tiny", *GENERATE, "--cache-dir", str(root))


def tokens(done: subprocess.CompletedProcess[str]) -> list[int]:
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    ids: list[int] = json.loads(done.stdout)["token_ids"]
    return ids


def one_line(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1, done.stderr
    return lines[0]


def model_folder(root: Path) -> Path:
    (folder,) = (root / "models").glob("tiny-*")
    return folder


def tree(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A store holding builtin:tiny's model and blobs, and the tokens a clean run gives."""
    root = tmp_path_factory.mktemp("models") / "warm"
    return root, tokens(generate(root))


def warm_copy(clean: tuple[Path, list[int]], where: Path) -> Path:
    shutil.copytree(clean[0], where, symlinks=True)
    return where


# -- item 17: models/ is owner-only -------------------------------------------------------


def test_models_folder_is_created_owner_only_and_check_fixes_an_open_one(
    clean: tuple[Path, list[int]], tmp_path: Path
) -> None:
    assert stat.S_IMODE((clean[0] / "models").stat().st_mode) == 0o700
    root = warm_copy(clean, tmp_path / "store")
    (root / "models").chmod(0o755)  # what ovspec made before issue 29
    found = ovspec("cache", "check", "--cache-dir", str(root))
    assert found.returncode == 1 and "models/ is open to other users (mode 755)" in found.stdout
    assert ovspec("cache", "check", "--fix", "--cache-dir", str(root)).returncode == 0
    assert stat.S_IMODE((root / "models").stat().st_mode) == 0o700
    assert ovspec("cache", "check", "--cache-dir", str(root)).returncode == 0


# -- item 4: a link at models/<name> is never followed --------------------------------------


def test_a_link_at_a_model_folder_is_refused_reported_and_removed(
    clean: tuple[Path, list[int]], tmp_path: Path
) -> None:
    root = warm_copy(clean, tmp_path / "store")
    folder = model_folder(root)
    outside = tmp_path / "outside-model"
    shutil.move(str(folder), str(outside))
    weights = outside / "openvino_model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = os.urandom(4096)  # other tokens if read
    weights.write_bytes(bytes(data))
    (outside / ".last-used").unlink()
    before = tree(outside)
    folder.symlink_to(outside, target_is_directory=True)

    refused = generate(root)
    assert "models/" in one_line(refused) and "symbolic link" in refused.stderr
    found = ovspec("cache", "check", "--cache-dir", str(root))
    assert found.returncode == 1 and f"models/{folder.name} is a symbolic link" in found.stdout
    assert ovspec("cache", "check", "--fix", "--cache-dir", str(root)).returncode == 0
    assert not folder.is_symlink() and tree(outside) == before  # link gone, target untouched
    assert tokens(generate(root)) == clean[1]  # written again, inside the store
    assert not folder.is_symlink() and tree(outside) == before
    assert ovspec("cache", "check", "--cache-dir", str(root)).returncode == 0


# -- item 3: a model folder another user owns is never used -------------------------------


@pytest.mark.parametrize("what", ["folder", "weights"])
def test_a_foreign_model_folder_is_refused_reported_and_rebuilt(
    clean: tuple[Path, list[int]], tmp_path: Path, what: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    root = warm_copy(clean, tmp_path / "store")
    folder = model_folder(root)
    weights = folder / "openvino_model.bin"
    owned = [folder, *folder.iterdir()] if what == "folder" else [weights]
    for path in owned:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    # What that user can now do: rewrite the weights in place.
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = os.urandom(4096)
    weights.write_bytes(bytes(data))

    refused = generate(root)
    assert "another user could change the model" in one_line(refused)
    found = ovspec("cache", "check", "--cache-dir", str(root))
    assert found.returncode == 1 and f"models/{folder.name}" in found.stdout
    assert "owned by" in found.stdout
    assert ovspec("cache", "check", "--fix", "--cache-dir", str(root)).returncode == 0
    assert tokens(generate(root)) == clean[1]  # written again, ours
    assert model_folder(root).stat().st_uid == os.geteuid()
    assert ovspec("cache", "check", "--cache-dir", str(root)).returncode == 0


# -- item 5: clear never removes a model folder in use ------------------------------------


def test_clear_keeps_a_model_folder_another_process_holds(
    clean: tuple[Path, list[int]], tmp_path: Path
) -> None:
    root = warm_copy(clean, tmp_path / "store")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root / "models")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = tree(model_folder(root))
        cleared = ovspec("cache", "clear", "--yes", "--cache-dir", str(root))
        assert cleared.returncode == 0, cleared.stderr
        assert not list((root / "blobs").rglob("*.blob"))  # the rest was cleared
        assert tree(model_folder(root)) == before  # the held model was not
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert ovspec("cache", "clear", "--yes", "--cache-dir", str(root)).returncode == 0
    assert not (root / "models").exists()  # no holder left: cleared


@pytest.mark.parametrize("command", ["generate", "build"])
def test_generate_and_build_are_unaffected_by_a_clear_loop(
    clean: tuple[Path, list[int]], tmp_path: Path, command: str
) -> None:
    for round_ in range(3):
        root = tmp_path / f"store-{round_}"  # a fresh store: the model is written under fire
        args = [*CLI, command, "builtin:tiny", "--cache-dir", str(root)]
        args += list(GENERATE) if command == "generate" else ["--ladder", "32,64", "--json"]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        clears = 0
        while proc.poll() is None:
            done = ovspec("cache", "clear", "--yes", "--cache-dir", str(root))
            assert "Traceback" not in done.stderr, done.stderr
            clears += 1
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "Traceback" not in err, err
        if command == "generate":
            assert json.loads(out)["token_ids"] == clean[1][:24]
        assert clears >= 1
