"""GGUF files end to end: ovspec's greedy tokens through a ladder with two boundaries equal
openvino-genai's LLMPipeline on the .gguf itself (llama and qwen2, F16 and quantized)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
import pytest

import ovspec
from ovspec.errors import ModelError
from ovspec.ir.normalize import RULE_BROADCAST, RULE_PRESENT_NAMES
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.specialize import Specialization
from ovspec.runtime.decoding import decode
from ovspec.store.local import Store

PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 300, size=20)]
NEW_TOKENS = 80  # 20 + 79 fed-back positions cross the 32 and 64 boundaries


def genai_greedy(model: Path, prompt: list[int], new_tokens: int) -> list[int]:
    pipe = openvino_genai.LLMPipeline(str(model), "CPU", **EXACT_CPU_PROPERTIES)
    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens = new_tokens
    cfg.ignore_eos = True
    cfg.do_sample = False
    cfg.apply_chat_template = False
    ids = np.array(prompt, dtype=np.int64)[None]
    out = pipe.generate(
        openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), cfg
    )
    return [int(t) for t in out.tokens[0]]


def test_greedy_tokens_equal_genai_on_the_gguf(gguf_file: Path, store: Store) -> None:
    expected = genai_greedy(gguf_file, PROMPT, NEW_TOKENS)
    assert len(set(expected)) > 20  # not a degenerate repetition
    with ovspec.open(
        gguf_file,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        load_mode="compile",  # rung graphs: what normalization made specializable
    ) as loader:
        result = decode(loader, PROMPT, max_new_tokens=NEW_TOKENS)
        report = loader._compiler.llm().normalized  # what normalization did to the IR
    assert list(result.token_ids) == expected
    assert result.rungs == (32, 64, 128)
    assert [b.at_live_tokens for b in result.boundaries] == [32, 64]
    # What made genai's IR specializable: both rules fired on it.
    assert report.by_rule(RULE_BROADCAST) and report.by_rule(RULE_PRESENT_NAMES)


def test_without_the_broadcast_rule_the_refusal_names_the_node(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ovspec.ir.normalize as normalize

    monkeypatch.setattr(normalize, "keep_dims_in_bidirectional_broadcasts", lambda model: [])
    from ovspec.ir.model_dir import resolve_model
    from ovspec.ir.specialize import prepare, read_ir

    model_dir = resolve_model(str(gguf_file), tmp_path / "models")
    llm = prepare(read_ir(model_dir.xml_path))
    with pytest.raises(ModelError) as caught:
        llm.specialize(Specialization.decode(32))
    message = str(caught.value)
    assert "\n" not in message
    assert "node Broadcast" in message and "(Broadcast)" in message
    assert "expected" in message and "ovspec doctor" in message
