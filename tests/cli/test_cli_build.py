"""`ovspec build`: the summary, --json, a warm second run, and every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openvino as ov
import pytest
from clirunner import run
from conftest import no_kv_graph

from ovspec.store.local import Store


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_help_lists_the_options() -> None:
    result = run("build", "--help")
    assert result.exit_code == 0
    for option in (
        "--ladder",
        "--phases",
        "--chunk",
        "--device",
        "--config",
        "--compress",
        "--jobs",
        "--cache-dir",
        "--json",
        "--blob-mode",
    ):
        assert option in result.output


def test_builtin_model_twice_second_run_is_all_hits(tmp_path: Path) -> None:
    args = [
        "build",
        "builtin:tiny",
        "--ladder",
        "32,64,128",
        "--cache-dir",
        str(tmp_path),
        "--json",
    ]
    first = run(*args)
    assert first.exit_code == 0, first.output
    cold = json.loads(first.stdout)
    assert cold["totals"]["misses"] == 6 and cold["totals"]["hits"] == 0
    assert {e["specialization"] for e in cold["entries"]} == {
        "decode@32",
        "prefill@32x32",
        "decode@64",
        "prefill@64x64",
        "decode@128",
        "prefill@128x128",
    }
    warm = json.loads(run(*args).stdout)
    assert warm["totals"]["hits"] == 6 and warm["totals"]["misses"] == 0
    assert warm["totals"]["compile_s"] == 0
    assert [e["key"] for e in warm["entries"]] == [e["key"] for e in cold["entries"]]
    with Store(tmp_path) as store:
        assert store.check() == []
        assert len(store.entries()) == 6


def test_text_summary_has_a_row_per_specialization(tmp_path: Path, qwen2_dir: Path) -> None:
    result = run(
        "build",
        str(qwen2_dir),
        "--ladder",
        "32,64",
        "--phases",
        "decode",
        "--cache-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    assert "decode@32" in result.output and "decode@64" in result.output
    assert "0 hits, 2 misses" in result.output


def test_jobs_build_the_same_keys(tmp_path: Path, qwen2_dir: Path) -> None:
    base = ["build", str(qwen2_dir), "--ladder", "32,64", "--json"]
    one = json.loads(run(*base, "--cache-dir", str(tmp_path / "a")).stdout)
    two = json.loads(run(*base, "--jobs", "2", "--cache-dir", str(tmp_path / "b")).stdout)
    assert [e["key"] for e in one["entries"]] == [e["key"] for e in two["entries"]]


def no_kv_model(folder: Path) -> Path:
    folder.mkdir()
    ov.save_model(no_kv_graph(), folder / "openvino_model.xml")
    return folder


def bad_inputs(tmp_path: Path, qwen2_dir: Path) -> dict[str, tuple[list[str], str]]:
    not_ir = tmp_path / "not_ir"
    not_ir.mkdir()
    (not_ir / "openvino_model.xml").write_text("hello")
    (not_ir / "openvino_model.bin").write_bytes(b"\0")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    model = str(qwen2_dir)
    return {
        "missing folder": ([str(tmp_path / "nowhere")], "does not exist"),
        "not an IR": ([str(not_ir)], "not an OpenVINO IR"),
        "no KV cache": ([str(no_kv_model(tmp_path / "no_kv"))], "no KV cache"),
        "malformed ladder": ([model, "--ladder", "64,32"], "not strictly increasing"),
        "rung over the limit": ([model, "--ladder", "8K,16K"], "max_position_embeddings 8192"),
        "unknown device": ([model, "--device", "XPU"], "not available here"),
        "bad config": ([model, "--config", "NOVALUE"], "KEY=VALUE"),
        "unknown property": ([model, "--config", "FOO=1"], "CPU has no property 'FOO'"),
        "bad property value": (
            [model, "--config", "INFERENCE_PRECISION_HINT=f33"],
            "Wrong value f33 for property key INFERENCE_PRECISION_HINT",
        ),
        "bad phases": ([model, "--phases", "decode,train"], "unknown phase"),
        "bad compression": ([model, "--compress", "int3"], "unknown compression"),
        "unwritable cache": ([model, "--cache-dir", str(blocker / "store")], "not writable"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing folder",
        "not an IR",
        "no KV cache",
        "malformed ladder",
        "rung over the limit",
        "unknown device",
        "bad config",
        "unknown property",
        "bad property value",
        "bad phases",
        "bad compression",
        "unwritable cache",
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_the_store_alone(
    tmp_path: Path, qwen2_dir: Path, case: str
) -> None:
    args, message = bad_inputs(tmp_path, qwen2_dir)[case]
    store_dir = tmp_path / "store"
    # A store that already holds an entry must come out byte-for-byte as it went in.
    seeded = run(
        "build",
        str(qwen2_dir),
        "--ladder",
        "32",
        "--phases",
        "decode",
        "--cache-dir",
        str(store_dir),
    )
    assert seeded.exit_code == 0, seeded.output
    before = {
        p: (store_dir / p).read_bytes()
        for p in tree(store_dir)
        if (store_dir / p).is_file() and "index" not in p
    }
    with Store(store_dir) as store:
        stats_before = store.stats()
    if "--cache-dir" not in args:
        args = [*args, "--cache-dir", str(store_dir)]
    result = run("build", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ovspec: error: "), result.stderr
    assert message in lines[0]
    after = {
        p: (store_dir / p).read_bytes()
        for p in tree(store_dir)
        if (store_dir / p).is_file() and "index" not in p
    }
    assert after == before
    with Store(store_dir) as store:
        assert store.stats() == stats_before
        assert store.check() == []


def test_a_fresh_cache_dir_is_not_created_for_bad_input(tmp_path: Path) -> None:
    result = run("build", str(tmp_path / "nowhere"), "--cache-dir", str(tmp_path / "new"))
    assert result.exit_code == 2
    assert not (tmp_path / "new").exists()


def test_a_model_copied_elsewhere_hits_the_same_blobs(tmp_path: Path, qwen2_dir: Path) -> None:
    """Keys name content, not paths: a moved model folder reuses its blobs."""
    copy = tmp_path / "moved"
    shutil.copytree(qwen2_dir, copy)
    base = ["--ladder", "32", "--phases", "decode", "--cache-dir", str(tmp_path / "s"), "--json"]
    assert json.loads(run("build", str(qwen2_dir), *base).stdout)["totals"]["misses"] == 1
    assert json.loads(run("build", str(copy), *base).stdout)["totals"]["hits"] == 1


def test_offline_npu_without_a_compiler_says_which_library_is_missing(
    tmp_path: Path, qwen2_dir: Path
) -> None:
    libs = Path(ov.__file__).parent / "libs"
    if "NPU" in ov.Core().available_devices or any(libs.glob("*npu_compiler*")):
        pytest.skip("this machine has an NPU or an NPU compiler")
    result = run(
        "build",
        str(qwen2_dir),
        "--ladder",
        "32",
        "--phases",
        "decode",
        "--device",
        "NPU",
        "--config",
        "NPU_PLATFORM=4000",
        "--config",
        "NPU_COMPILER_TYPE=PLUGIN",
        "--cache-dir",
        str(tmp_path),
    )
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NPU failed to compile decode@32" in lines[0]
    assert "npu_compiler" in lines[0] and "Exception from" not in lines[0]
    with Store(tmp_path) as store:
        assert store.entries() == [] and store.check() == []


def test_an_all_hits_rebuild_never_prepares_the_model(
    tmp_path: Path, qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["build", str(qwen2_dir), "--ladder", "32,64", "--cache-dir", str(tmp_path)]
    assert run(*args).exit_code == 0

    def no_prepare(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("an all-hits rebuild must not read or compress the model")

    monkeypatch.setattr("ovspec.compile.prewarm.prepare_model", no_prepare)
    monkeypatch.setattr("ovspec.compile.preparing.prepare_model", no_prepare)
    again = run(*args)
    assert again.exit_code == 0, again.output
    assert "4 hits, 0 misses" in again.output
    # The summary's wall is the whole command's, and sizes print in one unit style.
    assert "wall " in again.output and "(building " in again.output
    assert "KiB" in again.output and "blob bytes" not in again.output
