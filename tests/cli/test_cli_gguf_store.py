"""What a GGUF ladder puts in the store, said where a user sees it: ``cache ls`` names the
model by its file, the build says whether ``generate`` will use its blobs here and that
compressed weights sit in every blob, and ``plan --measure`` names where its costs came
from (a compile from the IR stores nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli
from ovspec.compile.devices import profile_for
from ovspec.compile.modes import LoadMode
from ovspec.testing.gguf import write_gguf

QWEN2 = Path(__file__).resolve().parents[1] / "data" / "qwen2"


def invoke_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf("qwen2", tmp_path_factory.mktemp("gguf") / "smol-q4.gguf", "Q4_0", seed=1)


def blob_bytes(model: str, store: Path, blob_mode: str) -> int:
    document = invoke_json(
        "build", model, "--ladder", "32", "--phases", "decode", "--blob-mode", blob_mode,
        "--cache-dir", str(store),
    )  # fmt: skip
    return int(document["totals"]["blob_bytes"])


def test_cache_ls_names_a_gguf_model_by_its_file(q4_gguf: Path, tmp_path: Path) -> None:
    invoke_json("build", str(q4_gguf), "--ladder", "32", "--cache-dir", str(tmp_path))
    entries = invoke_json("cache", "ls", "--cache-dir", str(tmp_path))
    assert isinstance(entries, list) and entries
    assert {e["model_label"] for e in entries} == {"smol-q4.gguf"}


def test_the_build_notes_say_what_the_blobs_are_for(q4_gguf: Path, tmp_path: Path) -> None:
    notes = invoke_json("build", str(q4_gguf), "--ladder", "32", "--cache-dir", str(tmp_path))[
        "notes"
    ]
    assert isinstance(notes, list)
    unused = [n for n in notes if "does not use these blobs" in n]
    assert len(unused) == (profile_for("CPU", {}).default_load_mode is not LoadMode.IMPORT)
    assert [n for n in notes if "compressed (u4)" in n and "every blob" in n]
    plain = invoke_json("build", str(QWEN2), "--ladder", "32", "--cache-dir", str(tmp_path))
    assert not [n for n in plain["notes"] if "compressed" in n]


def test_compressed_weights_sit_in_every_blob_as_the_note_says(
    q4_gguf: Path, tmp_path: Path
) -> None:
    """The measured fact behind the note (docs/weightless.md): a weightless blob of a
    compressed IR is about as large as a full one; an f16 IR's is a fraction of it."""
    q4_weightless = blob_bytes(str(q4_gguf), tmp_path / "a", "weightless")
    q4_full = blob_bytes(str(q4_gguf), tmp_path / "b", "full")
    assert q4_weightless > 0.9 * q4_full
    f16 = str(write_gguf("qwen2", tmp_path / "f16.gguf", "F16", seed=1))
    assert blob_bytes(f16, tmp_path / "c", "weightless") < 0.5 * blob_bytes(
        f16, tmp_path / "d", "full"
    )


@pytest.mark.parametrize("load_mode", ["compile", "import"])
def test_plan_says_whether_its_measured_builds_were_stored(load_mode: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    document = invoke_json(
        "plan", "builtin:tiny", "--ladder", "32,64", "--prompt-tokens", "16",
        "--measure-steps", "2", "--load-mode", load_mode, "--cache-dir", str(store),
    )  # fmt: skip
    source = document["sources"]["compile"]
    stored = list((store / "blobs").rglob("*.blob")) if (store / "blobs").is_dir() else []
    if load_mode == "import":
        assert "store build" in source and stored
    else:
        assert "nothing stored" in source and not stored
