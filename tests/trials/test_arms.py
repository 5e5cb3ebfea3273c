"""Arms: parsing from options and TOML, validation, and a worker's environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ovspec.errors import BadRequestError
from ovspec.stats.orders import Arm
from ovspec.trials.arms import ArmSpec, load_arms, make_arm


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_make_arm_merges_common_properties_arm_wins_and_canonicalizes() -> None:
    arm = make_arm(
        Arm.B,
        properties=[("NUM_STREAMS", "2"), ("INFERENCE_PRECISION_HINT", "f32")],
        common_properties=[("INFERENCE_PRECISION_HINT", "bf16"), ("PERF_COUNT", "NO")],
        env=[("ZED", "1"), ("ALPHA", "2")],
    )
    assert arm.label == "B"
    assert arm.python == Path(sys.executable)
    assert arm.properties == (
        ("INFERENCE_PRECISION_HINT", "f32"),
        ("NUM_STREAMS", "2"),
        ("PERF_COUNT", "NO"),
    )
    assert arm.env == (("ALPHA", "2"), ("ZED", "1"))
    assert arm.to_dict()["config"]["INFERENCE_PRECISION_HINT"] == "f32"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"properties": [("CACHE_DIR", "/tmp/x")]}, "never cache loads"),
        ({"common_properties": [("cache_dir", "/tmp/x")]}, "never cache loads"),
        ({"env": [("LD_LIBRARY_PATH", "/x")]}, "pythonpath= and libs="),
        ({"env": [("PYTHONPATH", "/x")]}, "pythonpath= and libs="),
        ({"env": [("1BAD", "x")]}, "not valid"),
        ({"python": "/no/such/python"}, "not an executable file"),
        ({"pythonpath": ["/no/such/folder"]}, "does not exist"),
        ({"libs": ["/no/such/folder"]}, "does not exist"),
        ({"label": ""}, "label"),
    ],
)
def test_bad_arms_are_bad_requests_with_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequestError, match=message) as info:
        make_arm(Arm.A, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("arm A")


def test_arm_specs_must_be_canonical() -> None:
    with pytest.raises(BadRequestError, match="canonical"):
        ArmSpec(Arm.A, "A", properties=(("B", "1"), ("A", "1")))


def test_process_env_drops_inherited_pythonpath_and_prepends_folders(tmp_path: Path) -> None:
    lib, py = tmp_path / "lib", tmp_path / "py"
    lib.mkdir()
    py.mkdir()
    arm = make_arm(Arm.A, pythonpath=[py], libs=[lib], env=[("OV_X", "1")])
    base = {"PYTHONPATH": "/leak", "LD_LIBRARY_PATH": "/system", "HOME": "/home/u"}
    env = arm.process_env(base, tmp_path / "pkg")
    assert env["PYTHONPATH"] == os.pathsep.join([str(py), str(tmp_path / "pkg")])
    assert env["LD_LIBRARY_PATH"] == os.pathsep.join([str(lib), "/system"])
    assert env["OV_X"] == "1" and env["HOME"] == "/home/u"
    bare = make_arm(Arm.B).process_env({"HOME": "/h"}, tmp_path / "pkg")
    assert "LD_LIBRARY_PATH" not in bare and bare["PYTHONPATH"] == str(tmp_path / "pkg")


def test_load_arms_from_toml_with_relative_paths_and_typed_values(tmp_path: Path) -> None:
    (tmp_path / "build" / "python").mkdir(parents=True)
    (tmp_path / "build" / "lib").mkdir()
    arms = write(
        tmp_path / "arms.toml",
        f"""
[a]
label = "stock"
[a.config]
PERF_COUNT = false

[b]
label = "patched"
python = "{sys.executable}"
pythonpath = "build/python"
libs = ["build/lib"]
[b.env]
OV_VERBOSE = 1
[b.config]
INFERENCE_NUM_THREADS = 2
""",
    )
    a, b = load_arms(arms, [("INFERENCE_PRECISION_HINT", "f32")])
    assert (a.arm, a.label, b.arm, b.label) == (Arm.A, "stock", Arm.B, "patched")
    assert dict(a.properties) == {"INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": "NO"}
    assert dict(b.properties) == {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "2"}
    assert b.pythonpath == (tmp_path / "build" / "python",)
    assert b.libs == (tmp_path / "build" / "lib",)
    assert b.env == (("OV_VERBOSE", "1"),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[a]\n", "no \\[b\\] table"),
        ("[a]\n[b]\n[c]\n", "only \\[a\\] and \\[b\\]"),
        ("[a]\nlabl = 'x'\n[b]\n", "unknown key 'labl'"),
        ("[a]\n[b]\nconfig = 3\n", "table of NAME = value"),
        ("[a]\n[b]\nlibs = [1]\n", "path or a list of paths"),
        ("[a]\n[b]\n[b.config]\nCACHE_DIR = '/c'\n", "never cache loads"),
        ("[a\n", "not valid TOML"),
    ],
)
def test_bad_arms_files_are_bad_requests(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        load_arms(write(tmp_path / "arms.toml", text))


def test_missing_arms_file_is_a_bad_request(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="cannot read arms file"):
        load_arms(tmp_path / "none.toml")
