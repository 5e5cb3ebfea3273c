"""`ovspec ab-compile`: help, every bad input as one line and exit 2, and a small
property A/B on the built-in model (stopped, resumed, reported as JSON, text, plot)."""

from __future__ import annotations

import json
from pathlib import Path

import openvino as ov
import pytest
from click.testing import CliRunner, Result

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli
from ovspec.compile.devices.facts import blob_control


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["ab-compile", *args])


def test_help_lists_the_options() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for option in (
        "--pairs",
        "--rungs",
        "--phase",
        "--chunk",
        "--device",
        "--config",
        "--arms",
        "--a-python",
        "--b-python",
        "--a-pythonpath",
        "--a-libs",
        "--a-env",
        "--b-config",
        "--seed",
        "--out",
        "--plot",
        "--max-runs",
        "--cache-dir",
        "--json",
    ):
        assert option in result.output
    assert "ab-compile" in CliRunner().invoke(cli, ["--help"]).output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pairs", "1"], "--pairs"),
        (["--rungs", "64,32"], "not strictly increasing"),
        (["--a-config", "CACHE_DIR=/tmp/c"], "never cache loads"),
        (["--config", "CACHE_DIR=/tmp/c"], "never cache loads"),
        (["--b-config", "NOVALUE"], "is not KEY=VALUE"),
        (["--b-python", "/no/such/python"], "not an executable file"),
        (["--a-env", "PYTHONPATH=/x"], "--a-pythonpath/--b-pythonpath and --a-libs/--b-libs"),
        (["--arms", "{tmp}/arms.toml", "--a-label", "x"], "not both"),
        (["--arms", "{tmp}/missing.toml"], "cannot read arms file"),
        (["--rungs", "65536"], "max_position_embeddings"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, qwen2_dir: Path, args: list[str], message: str
) -> None:
    (tmp_path / "arms.toml").write_text("[a]\n[b]\n")
    argv = [str(qwen2_dir), "--out", str(tmp_path / "r.jsonl")]
    argv += [a.format(tmp=tmp_path) for a in args]
    result = run(*argv)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("ovspec: error: ")
    assert not (tmp_path / "r.jsonl").exists()


def test_an_unusable_device_fails_on_the_first_run_with_exit_2(
    tmp_path: Path, qwen2_dir: Path
) -> None:
    out = tmp_path / "r.jsonl"
    result = run(
        str(qwen2_dir), "--rungs", "32", "--pairs", "2", "--device", "NOPE", "--out", str(out)
    )
    assert result.exit_code == 2
    assert "'NOPE' is not usable here" in result.stderr.splitlines()[-1]
    assert not out.exists()


def test_property_ab_on_the_builtin_model_end_to_end(tmp_path: Path) -> None:
    # Arm B sets a property that changes the blob on this CPU (read from the device:
    # on an AVX2-only CPU the default precision already is f32).
    name, value = blob_control(ov.Core(), "CPU")
    out, plot = tmp_path / "trial.jsonl", tmp_path / "trial.png"
    args = [
        "builtin:tiny",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--rungs",
        "32",
        "--pairs",
        "2",
        "--a-label",
        "default",
        "--b-label",
        "control",
        "--b-config",
        f"{name}={value}",
        "--out",
        str(out),
    ]
    stopped = run(*args, "--max-runs", "2", "--json")
    assert stopped.exit_code == 0, stopped.output
    assert json.loads(stopped.stdout) == {
        "complete": False,
        "results": str(out),
        "done": 2,
        "total": 6,
    }
    assert "run the same command to continue" in stopped.stderr

    finished = run(*args, "--json", "--plot", str(plot))
    assert finished.exit_code == 0, finished.output
    assert finished.stderr.count("arm ") == 4  # only the 4 runs left were made
    doc = json.loads(finished.stdout)
    assert doc["complete"] and doc["pairs"] == 2 and doc["warmup_pairs"] == 1
    assert sorted(doc["orders"][1:]) == ["AB", "BA"]  # counterbalanced
    (rung,) = doc["rungs"]
    assert rung["specialization"] == "decode@32"
    assert rung["blob_identity"]["verdict"] == "different"  # the control changes the blob
    for what in ("wall", "cpu"):
        s = rung[what]
        assert s["n_pairs"] == 2
        assert s["t_test"]["ci_low"] <= s["mean_diff"] <= s["t_test"]["ci_high"]
        assert s["sign_flip"]["method"] == "exact"
        assert s["sign_flip"]["min_attainable_p"] == 0.5
    assert doc["arms"]["B"]["config"] == {name: value}
    assert doc["arms"]["A"]["environment"]["libraries"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Run again: nothing left to compile, the text report is printed again.
    text = run(*args)
    assert text.exit_code == 0, text.output
    assert "arm " not in text.stderr
    for phrase in (
        "2 measured + 1 warm-up",
        "A default:",
        "B control:",
        f"{name}={value}",
        "95% CI of B−A",
        "sign-flip p",
        "min p",
        "0/2",
        "different",
        "cannot reach a sign-flip p below 0.5",
    ):
        assert phrase in text.stdout

    # The same file under another seed is another trial: refused, exit 4.
    other = run(*args, "--seed", "3")
    assert other.exit_code == 4
    assert "made by a different trial" in other.stderr


def test_a_trial_on_the_npu_plugin_with_npuw_on_cpu_gates_on_identical_blobs(
    tmp_path: Path,
) -> None:
    """Fresh processes on the NPU path: their exports differ in NPUW's random token only,
    which the blob-identity gate reads as zeros, so neutral arms are identical."""
    result = run(
        "builtin:tiny",
        "--device",
        "NPU",
        "--config",
        "NPUW_DEVICES=CPU",
        "--rungs",
        "32",
        "--pairs",
        "2",
        "--out",
        str(tmp_path / "trial.jsonl"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device"] == "NPU"
    identity = report["arms"]["A"]["environment"]["device_identity"]
    assert identity["NPU_PLUGIN_MODE"] == "NPUW on CPU subdevices"
    assert [r["blob_identity"]["verdict"] for r in report["rungs"]] == ["identical"]
