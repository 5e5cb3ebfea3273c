"""The dynamic graph prepared once, on first use or ahead on a thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ovspec.compile import preparing as preparing_module
from ovspec.compile.compiler import Compiler
from ovspec.compile.devices import CpuProfile
from ovspec.compile.modes import LoadMode
from ovspec.compile.preparing import PreparedModel
from ovspec.errors import DeviceError, ModelError
from ovspec.ir.compression import Compression
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.store.local import Store


def _preparing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ovspec-prepare"]


def test_a_graph_prepared_ahead_is_the_one_every_caller_gets(qwen2_dir: Path) -> None:
    prepared = PreparedModel(ModelDir.open(qwen2_dir), Compression())
    assert not prepared.started and prepared.peek() is None
    prepared.start()
    assert prepared.started
    first = prepared.get()
    assert prepared.get() is first and prepared.peek() is first
    assert first.roles.kv  # a prepared LLM graph, not a placeholder


def test_an_error_while_preparing_ahead_is_raised_by_get_not_by_the_thread(
    tmp_path: Path,
) -> None:
    (tmp_path / "openvino_model.xml").write_text("<net>not an IR</net>", encoding="utf-8")
    (tmp_path / "openvino_model.bin").write_bytes(b"")
    prepared = PreparedModel(ModelDir.open(tmp_path), Compression())
    prepared.start()
    prepared.settle()  # waits, and drops the error
    for _ in range(2):  # asked again, raised again: never a half-prepared graph
        with pytest.raises(ModelError, match="not a readable OpenVINO IR"):
            prepared.get()
    assert prepared.peek() is None


def test_a_compiler_that_compiles_from_the_ir_prepares_while_it_probes_the_device(
    qwen2_dir: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparing, probed = threading.Event(), threading.Event()
    real_prepare = preparing_module.prepare_model
    overlapped: list[bool] = []

    def prepare_model(*args: object) -> object:
        preparing.set()
        probed.wait(10)
        return real_prepare(*args)  # type: ignore[arg-type]

    def probe(*_args: object) -> object:
        overlapped.append(preparing.wait(10))  # the read began before the probe ended
        probed.set()
        raise DeviceError("no such device (test)")

    monkeypatch.setattr(preparing_module, "prepare_model", prepare_model)
    monkeypatch.setattr(CpuProfile, "resolve", probe)
    with pytest.raises(DeviceError, match="no such device"):
        Compiler(
            ModelDir.open(qwen2_dir), "CPU", EXACT_CPU_PROPERTIES, store, load_mode=LoadMode.COMPILE
        )
    assert overlapped == [True]
    # A compiler that failed to open leaves nothing running behind it.
    assert not any(t.is_alive() for t in _preparing_threads())


@pytest.mark.parametrize(
    ("load_mode", "compression"),
    [(LoadMode.IMPORT, Compression()), (LoadMode.COMPILE, Compression.parse("int8"))],
)
def test_no_read_ahead_for_imports_or_a_compression(
    qwen2_dir: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    load_mode: LoadMode,
    compression: Compression,
) -> None:
    # A warm import never reads the IR; a compression (NNCF, minutes on a large model)
    # is not started before the device has accepted the properties.
    calls: list[object] = []
    monkeypatch.setattr(preparing_module, "prepare_model", lambda *a: calls.append(a))
    compiler = Compiler(
        ModelDir.open(qwen2_dir),
        "CPU",
        EXACT_CPU_PROPERTIES,
        store,
        load_mode=load_mode,
        compression=compression,
    )
    compiler.close()  # would wait for a read started ahead
    assert calls == [] and not _preparing_threads()
