"""`ovspec build/generate model.gguf`, --chat through the tokenizer's template (text equal
to openvino-genai's), sampling flags that replay, stop strings, and input checked at the
edge: one line, exit 2."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import openvino_genai
import pytest
from clirunner import EXACT, generate_json, run

from ovspec.ir.gguf import gguf_digest
from ovspec.ir.reference import EXACT_CPU_PROPERTIES

LADDER = "32,64"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ovspec.testing.gguf import write_gguf

    return write_gguf("qwen2", tmp_path_factory.mktemp("cli-gguf") / "m.gguf", "Q8_0", seed=2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-cache")


def genai_text(model: Path, prompt: str, new_tokens: int, chat: bool) -> str:
    pipe = openvino_genai.LLMPipeline(str(model), "CPU", **EXACT_CPU_PROPERTIES)
    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens = new_tokens
    cfg.ignore_eos = True
    cfg.apply_chat_template = chat
    return str(pipe.generate(prompt, cfg))


def test_build_a_gguf_file_twice_is_all_hits(gguf: Path, cache: Path) -> None:
    args = ["build", str(gguf), "--ladder", LADDER, "--json", "--cache-dir", str(cache), *EXACT]
    first = run(*args)
    assert first.exit_code == 0, first.output
    document = json.loads(first.stdout)
    assert document["model"] == str(cache / "models" / f"gguf-{gguf_digest(gguf)}")
    second = json.loads(run(*args).stdout)
    assert second["totals"]["misses"] == 0 and second["totals"]["hits"] == 4


@pytest.mark.parametrize("chat", [True, False])
def test_text_equals_genai_with_and_without_the_chat_template(
    gguf: Path, cache: Path, chat: bool
) -> None:
    # genai's generate(text) applies the chat template by default; ovspec's PROMPT does
    # not, --chat does.
    prompt = ["--chat", "Hello there"] if chat else ["Hello there"]
    args = [str(gguf), *prompt, "--max-new-tokens", "40", "--ladder", LADDER, "--ignore-eos"]
    result = run("generate", *args, "--cache-dir", str(cache), *EXACT)
    assert result.exit_code == 0, result.output
    assert result.stdout == genai_text(gguf, "Hello there", 40, chat) + "\n"


def test_chat_on_an_optimum_export(qwen2_dir: Path, tmp_path: Path) -> None:
    document = generate_json(
        str(qwen2_dir), "--chat", "Hi", "--max-new-tokens", "8", "--ignore-eos",
        "--ladder", LADDER, "--cache-dir", str(tmp_path), *EXACT,
    )  # fmt: skip
    tokenizer = openvino_genai.Tokenizer(str(qwen2_dir))
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert templated.startswith("<|im_start|>user\nHi<|im_end|>")
    expected = tokenizer.encode(templated, add_special_tokens=False).input_ids.data[0].tolist()
    assert document["prompt_ids"] == expected


def test_a_model_without_a_chat_template(qwen2_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(qwen2_dir, model)
    xml = model / "openvino_tokenizer.xml"
    xml.write_text(re.sub(r"\s*<chat_template value=\"[^\"]*\" />", "", xml.read_text()))
    result = run("generate", str(model), "--chat", "Hi", "--cache-dir", str(tmp_path / "c"))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"ovspec: error: {model} has no chat template (no chat_template in its "
        "openvino_tokenizer.xml); give a plain PROMPT instead of --chat"
    )


def test_seeded_sampling_replays(gguf: Path, cache: Path) -> None:
    base = [str(gguf), "--ids", "5,6,7,8", "--max-new-tokens", "30", "--ignore-eos"]
    base += ["--ladder", LADDER, "--cache-dir", str(cache), *EXACT]
    sample = ["--do-sample", "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95"]
    first = generate_json(*base, *sample, "--rng-seed", "7")["token_ids"]
    assert generate_json(*base, *sample, "--rng-seed", "7")["token_ids"] == first
    assert generate_json(*base, *sample, "--rng-seed", "8")["token_ids"] != first
    greedy = generate_json(*base)["token_ids"]
    assert greedy != first
    # Sampling settings without --do-sample leave greedy alone (as in genai).
    assert generate_json(*base, "--temperature", "1.5", "--top-k", "3")["token_ids"] == greedy


def test_stop_string_cuts_the_text(gguf: Path, cache: Path) -> None:
    base = [str(gguf), "The", "--max-new-tokens", "40", "--ladder", LADDER]
    base += ["--cache-dir", str(cache), *EXACT]
    full = generate_json(*base, "--ignore-eos")
    text = str(full["text"])
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip() and text.index(stop) > 0
    cut = generate_json(*base, "--ignore-eos", "--stop-string", stop)
    assert cut["stop_reason"] == "stop_string"
    assert cut["text"] == text[: text.index(stop)].rstrip(" \n")
    kept = generate_json(
        *base, "--ignore-eos", "--stop-string", stop, "--include-stop-str-in-output"
    )
    assert str(kept["text"]).endswith(stop.rstrip(" \n"))
    streamed = run("generate", *base, "--ignore-eos", "--stop-string", stop)
    assert streamed.stdout == f"{cut['text']}\n"  # nothing streamed that was taken back


def test_stop_token_id(gguf: Path, cache: Path) -> None:
    base = [str(gguf), "--ids", "9,10,11", "--max-new-tokens", "30", "--ladder", LADDER]
    base += ["--cache-dir", str(cache), *EXACT]
    full = generate_json(*base, "--ignore-eos")["token_ids"]
    assert isinstance(full, list)
    stop = full[5]
    stopped = generate_json(*base, "--stop-token-id", str(stop))
    assert stopped["token_ids"] == full[: full.index(stop) + 1]
    assert stopped["stop_reason"] == "eos"
    # ignore_eos turns stop token ids off too (genai's meaning).
    assert generate_json(*base, "--stop-token-id", str(stop), "--ignore-eos")["token_ids"] == full


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ids", "5,2048"], "token id 2048 at prompt position 1 is outside the model's vocab"),
        (["--ids", ",".join(["5"] * 40), "--ladder", "32"], "the prompt has 40 tokens, over"),
        (["--chat", ""], "the chat message is empty"),
        (["--chat", "Hi", "--ids", "1"], "exactly one of PROMPT"),
        (["--ids", "1", "--do-sample", "--temperature", "0"], "temperature must be > 0"),
        (["--ids", "1", "--do-sample", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["--ids", "1", "--repetition-penalty", "0"], "repetition_penalty must be > 0"),
        (["--ids", "1", "--top-k", "-2"], "'--top-k'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, qwen2_dir: Path, tmp_path: Path
) -> None:
    result = run("generate", str(qwen2_dir), *args, "--cache-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ovspec: error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


def test_stop_strings_need_a_detokenizer(cache: Path) -> None:
    result = run("generate", "builtin:tiny", "--ids", "1,2", "--stop-string", "x",
                 "--cache-dir", str(cache))  # fmt: skip
    assert result.exit_code == 2
    assert "stop strings need the model's tokenizer and detokenizer" in result.stderr


def test_help_lists_the_generation_options() -> None:
    result = run("generate", "--help")
    assert result.exit_code == 0
    for option in (
        "--chat",
        "--do-sample",
        "--temperature",
        "--top-k",
        "--top-p",
        "--repetition-penalty",
        "--rng-seed",
        "--stop-token-id",
        "--stop-string",
        "--include-stop-str-in-output",
    ):
        assert option in result.output
