"""`ovspec doctor`: roles, KV layout, rewrites and checks; a model that fails is the report,
then one error line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import run


def test_a_healthy_export(qwen2_dir: Path, tmp_path: Path) -> None:
    result = run("doctor", str(qwen2_dir), "--ladder", "32,64", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "kv        2 layers x key/value, [batch, 2, seq, 16] f32, 512 bytes/token" in out
    assert "layer 1 value past_key_values.1.value -> present.1.value (seq axis 2)" in out
    for stage in ("read", "stateless", "normalize", "roles", "decode@32", "prefill@64x64"):
        assert f"ok        {stage}: " in out
    assert result.stderr == ""


def test_json_on_a_gguf_file(tmp_path: Path) -> None:
    from ovspec.testing.gguf import write_gguf

    gguf = write_gguf("llama", tmp_path / "m.gguf", "Q4_0")
    args = ["doctor", str(gguf), "--ladder", "32,64", "--json", "--cache-dir", str(tmp_path / "c")]
    result = run(*args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is True and document["variables"] == 4
    rules = {r["rule"] for r in document["rewrites"]}
    assert rules == {"keep-dims-in-bidirectional-broadcasts", "unique-present-names"}
    kv = document["roles"]["kv"]
    assert [(r["layer"], r["kind"], r["present"]) for r in kv][:2] == [
        (0, "key", "present.0.key"),
        (0, "value", "present.0.value"),
    ]
    assert document["roles"]["vocab_tokens"] == 3 + 256 + 50  # specials, bytes, merges


def test_a_failing_model_is_the_report_then_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ovspec.ir.normalize as normalize
    from ovspec.testing.gguf import write_gguf

    gguf = write_gguf("qwen2", tmp_path / "m.gguf", "F16")
    monkeypatch.setattr(normalize, "keep_dims_in_bidirectional_broadcasts", lambda model: [])
    result = run("doctor", str(gguf), "--ladder", "32", "--cache-dir", str(tmp_path / "c"))
    assert result.exit_code == 2
    assert (
        "FAILED    decode@32: cannot reshape the IR to decode@32: node Broadcast" in result.stdout
    )
    assert "ok        roles: " in result.stdout  # the stages before still report
    *said, error = result.stderr.splitlines()
    assert [line for line in said if not line.startswith("ovspec: converting m.gguf")] == []
    assert error.startswith("ovspec: error: ")
    assert "fails at decode@32" in error and "expected a target shape" in error


def test_a_folder_without_kv_fails_at_roles(tmp_path: Path) -> None:
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    ids.output(0).get_tensor().set_names({"input_ids"})
    out = ops.convert(ids, "f32")
    out.output(0).get_tensor().set_names({"logits"})
    ov.save_model(ov.Model([out.output(0)], [ids]), tmp_path / "m" / "openvino_model.xml")
    result = run("doctor", str(tmp_path / "m"), "--ladder", "32", "--cache-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "FAILED    roles: " in result.stdout
    assert "fails at roles" in result.stderr


def test_help() -> None:
    result = run("doctor", "--help")
    assert result.exit_code == 0
    for option in ("MODEL", "--ladder", "--chunk", "--cache-dir", "--json"):
        assert option in result.output


def test_a_built_in_model_is_never_written_into_a_store_read_only_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ovspec.store.local import Store

    shared, own = tmp_path / "shared", tmp_path / "own"
    Store(shared).close()
    monkeypatch.setenv("OVSPEC_TRUST_SHARED_STORE", "1")  # opens `shared` read-only
    monkeypatch.setenv("OVSPEC_CACHE_DIR", str(own))
    result = run("doctor", "builtin:tiny", "--ladder", "32", "--cache-dir", str(shared))
    assert result.exit_code == 0, result.output
    assert not (shared / "models").exists()
    assert [p.name.rpartition("-")[0] for p in (own / "models").iterdir()] == ["tiny"]
