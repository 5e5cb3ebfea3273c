"""The public library surface: every name ``ovspec`` exports is listed and resolves
without importing OpenVINO first, and a loader or a ``.gguf`` gives its tokenizer (text
in, chat template, streamed text out) through public names only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openvino_genai
import pytest

import ovspec
from ovspec.store.local import Store
from ovspec.testing.gguf import EOS_TOKEN_ID, write_gguf


def test_dir_lists_every_public_name_and_each_resolves() -> None:
    listed = dir(ovspec)
    for name in ovspec.__all__:
        assert name in listed
        assert getattr(ovspec, name) is not None
    with pytest.raises(AttributeError):
        ovspec.no_such_name  # noqa: B018


def test_importing_ovspec_loads_no_openvino() -> None:
    code = "import sys, ovspec; dir(ovspec); print('openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf("qwen2", tmp_path_factory.mktemp("tok") / "chat.gguf", "Q8_0", seed=2)


def test_a_gguf_file_gives_its_tokenizer(gguf: Path, store: Store) -> None:
    tok = ovspec.tokenizer(gguf, store=store)
    ids = tok.encode("the other theme")
    assert ids and tok.decode(ids) == "the other theme"
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.finish()]
    assert "".join(pieces) == "the other theme"
    assert EOS_TOKEN_ID in tok.eos_token_ids
    assert tok.generation_config(5).eos_token_ids == tok.eos_token_ids
    # The chat template renders as openvino-genai's own tokenizer renders it.
    assert tok.has_chat_template
    genai = openvino_genai.Tokenizer(str(tok.model_dir.root))
    text = genai.apply_chat_template(
        [{"role": "user", "content": "hi there"}], add_generation_prompt=True
    )
    expected = [int(i) for i in genai.encode(text, add_special_tokens=False).input_ids.data[0]]
    assert tok.apply_chat_template("hi there") == expected


def test_a_loader_gives_the_same_tokenizer(gguf: Path, store: Store) -> None:
    with ovspec.open(gguf, ladder="32,64", store=store) as loader:
        from_loader = loader.tokenizer.encode("hello there")
        assert loader.tokenizer is loader.tokenizer  # made once
    assert from_loader == ovspec.tokenizer(gguf, store=store).encode("hello there")


def test_a_folder_tokenizer_opens_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSPEC_CACHE_DIR", str(tmp_path / "store"))
    qwen2 = Path(__file__).resolve().parents[1] / "data" / "qwen2"
    assert ovspec.tokenizer(qwen2).encode("Hello")
    assert not (tmp_path / "store").exists()
