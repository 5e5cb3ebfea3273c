"""GGUF intake: the header is read without the weights, the IR is built once through
openvino-genai into the store's models/ folder keyed by the file's digest, and a file
genai cannot read is one clear line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from ovspec.errors import ModelError
from ovspec.ir.files import read_rt_info
from ovspec.ir.gguf import (
    MANIFEST_NAME,
    gguf_digest,
    import_gguf,
    is_gguf_reference,
    read_gguf_header,
)
from ovspec.ir.model_dir import ModelDir, resolve_model, writes_into_store
from ovspec.testing.gguf import GGUFShape, write_gguf


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gguf-intake")
    return write_gguf("qwen2", folder / "m.gguf", "Q8_0", shape=GGUFShape(context_tokens=512))


def test_header_names_architecture_and_context(small_gguf: Path) -> None:
    header = read_gguf_header(small_gguf)
    assert (header.architecture, header.context_tokens, header.version) == ("qwen2", 512, 3)
    assert header.tensors == 3 + 2 * 12  # embeddings, norm, output; 9 matmuls + 3 biases


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_gguf_header(bad)


def test_a_truncated_header_is_refused(small_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes()[:40])
    with pytest.raises(ModelError, match="damaged GGUF header"):
        read_gguf_header(cut)


def test_references(small_gguf: Path) -> None:
    assert is_gguf_reference("a/b/Model.GGUF") and not is_gguf_reference("a/model")
    assert writes_into_store(str(small_gguf)) and writes_into_store("builtin:tiny")
    assert not writes_into_store("some/folder")
    assert not writes_into_store("missing.gguf")  # refused before a store is opened


def test_imported_once_keyed_by_digest(small_gguf: Path, tmp_path: Path) -> None:
    models = tmp_path / "store" / "models"
    folder = import_gguf(small_gguf, models)
    assert folder == models / f"gguf-{gguf_digest(small_gguf)}"
    names = {p.name for p in folder.iterdir()}
    assert {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml"} <= names
    assert small_gguf.name not in names  # the link genai read through is gone
    config = json.loads((folder / "config.json").read_text())
    assert config == {"model_type": "qwen2", "max_position_embeddings": 512, "eos_token_id": 0}
    assert json.loads((folder / MANIFEST_NAME).read_text())["source"] == str(small_gguf)
    assert [p.name for p in models.iterdir()] == [folder.name]  # no staging left behind
    # The same bytes under another name: the same folder, not rebuilt.
    stamp = (folder / "openvino_model.xml").stat().st_mtime_ns
    copy = tmp_path / "renamed.gguf"
    shutil.copy(small_gguf, copy)
    assert import_gguf(copy, models) == folder
    assert (folder / "openvino_model.xml").stat().st_mtime_ns == stamp
    model_dir = resolve_model(str(copy), models)
    assert isinstance(model_dir, ModelDir) and model_dir.max_position_embeddings == 512
    assert read_rt_info(model_dir.tokenizer_xml or Path()).get("eos_token_id") == "0"


def test_another_file_gets_another_folder(small_gguf: Path, tmp_path: Path) -> None:
    other = write_gguf("qwen2", tmp_path / "m.gguf", "Q8_0", seed=5)
    models = tmp_path / "models"
    assert import_gguf(other, models) != import_gguf(small_gguf, models)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        import_gguf(tmp_path / "none.gguf", tmp_path / "models")


def test_an_architecture_genai_cannot_read(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.add_context_length(128)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match="holds a 'phi2' model") as caught:
        import_gguf(path, tmp_path / "models")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "models").exists()


def test_a_truncated_file_is_refused_before_genai_reads_it(
    small_gguf: Path, tmp_path: Path
) -> None:
    # genai itself reads a file whose weights are cut off without a word.
    header = read_gguf_header(small_gguf)
    assert header.data_end_bytes == small_gguf.stat().st_size  # the table accounts for all
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes()[:-1])
    with pytest.raises(ModelError, match=r"truncated: .* bytes, its tensor table needs"):
        import_gguf(cut, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_block_sizes_match_the_gguf_package() -> None:
    import gguf

    from ovspec.ir.gguf import _BLOCKS

    for kind, blocks in _BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)] == blocks


def test_without_genai_the_error_says_what_to_install(
    small_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino_genai", None)
    with pytest.raises(ModelError, match="pip install"):
        import_gguf(small_gguf, tmp_path / "models")
