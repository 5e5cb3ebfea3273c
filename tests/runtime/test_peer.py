"""genai as the peer: CPU's default (the paged graph) gives openvino-genai's default
greedy tokens, on the device's own default properties whatever they are here; rung graphs
and set precisions are reported as the differences they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
import pytest

import ovspec
from ovspec.ir.model_dir import resolve_model
from ovspec.runtime.decoding import decode
from ovspec.runtime.peer import (
    ATTENTION,
    KV_PRECISION_PROPERTIES,
    genai_defaults,
    genai_differences,
    property_text,
)
from ovspec.store.local import Store
from ovspec.testing.gguf import write_gguf

PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 300, size=20)]
NEW_TOKENS = 60  # 20 + 59 fed back: the KV grows over 32 and 64


def genai_default_greedy(model: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """genai's LLMPipeline as a user runs it: no properties at all."""
    pipe = openvino_genai.LLMPipeline(str(model), "CPU")
    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens = new_tokens
    cfg.ignore_eos = True
    cfg.apply_chat_template = False
    ids = np.array(prompt, dtype=np.int64)[None]
    out = pipe.generate(
        openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), cfg
    )
    return [int(t) for t in out.tokens[0]]


@pytest.fixture(scope="module", params=["qwen2-fixture", "gguf-qwen2-Q4_0"])
def model_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "qwen2-fixture":
        return Path(__file__).resolve().parents[1] / "data" / "qwen2"
    folder = tmp_path_factory.mktemp("peer")
    gguf = write_gguf("qwen2", folder / "tiny.gguf", "Q4_0", seed=1)
    return resolve_model(str(gguf), folder / "models").root  # the IR ovspec wrote


def test_default_greedy_equals_genai_default(model_root: Path, store: Store) -> None:
    expected = genai_default_greedy(model_root, PROMPT, NEW_TOKENS)
    assert len(set(expected)) > 20  # not a degenerate repetition
    with ovspec.open(model_root, ladder="32,64,128", store=store) as loader:
        assert genai_differences(loader) == ()
        result = decode(loader, PROMPT, max_new_tokens=NEW_TOKENS)
    assert list(result.token_ids) == expected
    assert result.rungs == (32, 64, 128)


def test_rung_graphs_name_their_attention_and_kv_precision(store: Store) -> None:
    model = Path(__file__).resolve().parents[1] / "data" / "qwen2"
    defaults = genai_defaults("CPU")
    with ovspec.open(model, ladder="32,64", store=store, load_mode="compile") as loader:
        found = {d.name: d for d in genai_differences(loader)}
        kv_type = {role.element_type.get_type_name() for role in loader.roles().kv}
    assert found[ATTENTION].genai == "PagedAttention"
    for name in KV_PRECISION_PROPERTIES:
        if name not in defaults:
            continue
        # The device's default cache precision against the graph's KV input type.
        if {defaults[name]} == kv_type:
            assert name not in found
        else:
            assert (found[name].ovspec, found[name].genai) == (",".join(kv_type), defaults[name])


def test_a_precision_the_caller_sets_is_a_difference(store: Store) -> None:
    model = Path(__file__).resolve().parents[1] / "data" / "qwen2"
    default = property_text(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    other = "f32" if default != "f32" else "f16"
    properties = {"INFERENCE_PRECISION_HINT": other}
    with ovspec.open(model, ladder="32,64", store=store, properties=properties) as loader:
        found = genai_differences(loader)
        resolved = property_text(
            ov.Core()
            .compile_model(_tiny(), "CPU", properties)
            .get_property("INFERENCE_PRECISION_HINT")
        )
    names = [d.name for d in found]
    if resolved == default:  # the device ignores the hint (no such precision here)
        assert "INFERENCE_PRECISION_HINT" not in names
    else:
        assert [(d.ovspec, d.genai) for d in found if d.name == "INFERENCE_PRECISION_HINT"] == [
            (resolved, default)
        ]


def _tiny() -> ov.Model:
    x = ov.opset13.parameter([1, 4], ov.Type.f32)
    return ov.Model([ov.opset13.relu(x)], [x])
