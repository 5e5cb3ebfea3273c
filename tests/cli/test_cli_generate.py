"""`ovspec generate` and the text codec: tokens equal the stateful model's and
openvino-genai's, text equals genai's, the stream never splits a character, and
every bad input is one line and exit 2."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
import pytest
from clirunner import EXACT, generate_json, run
from hypothesis import given
from hypothesis import strategies as st

from ovspec.cli.generate import KV_LAYOUT_CHOICES, POLICY_CHOICES
from ovspec.compile.devices import profile_for
from ovspec.errors import BadRequestError, ModelError
from ovspec.ir.model_dir import ModelDir
from ovspec.ir.reference import EXACT_CPU_PROPERTIES, StatefulRunner
from ovspec.runtime.kv import KVLayout
from ovspec.runtime.loader import EventKind, Policy
from ovspec.runtime.textcodec import REPLACEMENT_CHAR, TextCodec, TextStream, eos_token_ids
from ovspec.store.local import Store

LADDER = "32,64,128"


def genai_pipeline(model_dir: Path) -> openvino_genai.LLMPipeline:
    return openvino_genai.LLMPipeline(str(model_dir), "CPU", **EXACT_CPU_PROPERTIES)


def genai_config(max_new_tokens: int) -> openvino_genai.GenerationConfig:
    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens = max_new_tokens
    cfg.ignore_eos = True
    cfg.do_sample = False
    cfg.apply_chat_template = False
    return cfg


def ints(value: object) -> list[int]:
    assert isinstance(value, list)
    return [int(v) for v in value]


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the builtin:tiny runs, so the model is written once."""
    return tmp_path_factory.mktemp("tiny-cache")


# -- tokens and text against the control and openvino-genai ------------------------


@pytest.mark.parametrize("load_mode", ["auto", "import"])
def test_greedy_ids_equal_the_stateful_model_and_genai(
    fixture_dir: Path, tmp_path: Path, load_mode: str
) -> None:
    prompt = [int(t) for t in np.load(fixture_dir / "reference.npz")["prompt_ids"][:16]]
    new_tokens = 80  # 16 + 79 fed-back positions cross the 32 and 64 boundaries
    document = generate_json(
        str(fixture_dir),
        "--ids",
        ",".join(map(str, prompt)),
        "--max-new-tokens",
        str(new_tokens),
        "--ladder",
        LADDER,
        "--chunk",
        "8",
        "--ignore-eos",
        "--cache-dir",
        str(tmp_path),
        "--load-mode",
        load_mode,
        *EXACT,
    )
    expected_mode = profile_for("CPU").default_load_mode.value if load_mode == "auto" else load_mode
    assert document["load_mode"] == expected_mode
    control = StatefulRunner(
        ov.Core().read_model(fixture_dir / "openvino_model.xml"), "CPU", EXACT_CPU_PROPERTIES
    ).greedy(prompt, new_tokens)
    ids = np.array(prompt, dtype=np.int64)[None]
    genai = genai_pipeline(fixture_dir).generate(
        openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))),
        genai_config(new_tokens),
    )
    assert ints(document["token_ids"]) == control == [int(t) for t in genai.tokens[0]]
    assert document["prompt_ids"] == prompt
    assert document["rungs"] == [32, 64, 128]
    boundaries = document["boundaries"]
    assert isinstance(boundaries, list)
    assert [(b["at_live_tokens"], b["from"], b["to"]) for b in boundaries] == [
        (32, 32, 64),
        (64, 64, 128),
    ]
    with Store(tmp_path) as store:
        assert store.check() == []


def test_text_prompt_streams_the_text_genai_generates(fixture_dir: Path, tmp_path: Path) -> None:
    args = [
        str(fixture_dir),
        "Hello, wörld",
        "--max-new-tokens",
        "40",
        "--ladder",
        LADDER,
        "--ignore-eos",
        "--cache-dir",
        str(tmp_path),
        *EXACT,
    ]
    pipe = genai_pipeline(fixture_dir)
    expected_text = pipe.generate("Hello, wörld", genai_config(40))
    expected_prompt = [
        int(t) for t in pipe.get_tokenizer().encode("Hello, wörld").input_ids.data[0]
    ]

    streamed = run("generate", *args)
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == expected_text + "\n"
    summary = streamed.stderr.splitlines()
    assert summary[-1].startswith("40 tokens (reached --max-new-tokens); "), summary

    document = generate_json(*args)
    assert document["text"] == expected_text
    assert document["prompt_ids"] == expected_prompt
    assert len(ints(document["token_ids"])) == 40


def test_stop_at_eos_unless_ignored(qwen2_dir: Path, tmp_path: Path) -> None:
    # The fixture's EOS (0) never comes up greedily, so a copy declares a token that does:
    # a list in generation_config.json, beside config.json's int.
    base = [str(qwen2_dir), "--ids", "5,6,7,8", "--ladder", LADDER, "--max-new-tokens", "30"]
    full = ints(
        generate_json(*base, "--ignore-eos", "--cache-dir", str(tmp_path / "store"))["token_ids"]
    )
    model = tmp_path / "model"
    shutil.copytree(qwen2_dir, model)
    stop = full[6]
    unused = max(set(range(2048)) - set(full))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [unused, stop]}))
    args = [str(model), *base[1:], "--cache-dir", str(tmp_path / "store")]

    stopped = generate_json(*args)
    first = min(full.index(t) for t in (stop, 0) if t in full)
    assert ints(stopped["token_ids"]) == full[: first + 1]
    assert stopped["stop_reason"] == "eos"

    ignored = generate_json(*args, "--ignore-eos")
    assert ints(ignored["token_ids"]) == full
    assert ignored["stop_reason"] == "max_new_tokens"


# -- builtin:tiny (no tokenizer): ids in, ids out -----------------------------------


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_json_fields_are_consistent(tiny_cache: Path, policy: str) -> None:
    document = generate_json(
        "builtin:tiny",
        "--ids",
        ",".join(str(i) for i in range(3, 23)),
        "--max-new-tokens",
        "60",
        "--ladder",
        LADDER,
        "--ignore-eos",
        "--policy",
        policy,
        "--load-mode",
        "compile",  # a policy schedules rung graphs; the paged default has one graph
        "--cache-dir",
        str(tiny_cache),
    )
    assert {
        "prompt_ids",
        "token_ids",
        "rungs",
        "boundaries",
        "events",
        "first_token_s",
        "finished_s",
    } <= set(document)
    assert "text" not in document  # the built-in model has no detokenizer
    assert len(ints(document["token_ids"])) == 60
    rungs = ints(document["rungs"])
    boundaries = document["boundaries"]
    assert isinstance(boundaries, list)
    assert rungs == [32, 64, 128] and len(boundaries) == len(rungs) - 1
    for boundary, (low, high) in zip(boundaries, itertools.pairwise(rungs), strict=True):
        assert (boundary["from"], boundary["to"]) == (low, high)
        assert boundary["at_live_tokens"] == low
        assert boundary["copied_bytes"] > 0  # copy-and-grow moves the live prefix
        assert boundary["migration_s"] >= 0 and boundary["program_wait_s"] >= 0
    events = document["events"]
    assert isinstance(events, list)
    assert {e["kind"] for e in events} <= {k.value for k in EventKind}
    assert all(set(e) == {"kind", "spec", "at_s", "foreground", "seconds", "note"} for e in events)
    loaded = {e["spec"] for e in events if e["kind"] == EventKind.LOADED.value}
    assert {"decode@32", "decode@64", "decode@128"} <= loaded
    background = [e for e in events if e["kind"] == "load_start" and not e["foreground"]]
    assert bool(background) == (policy in ("one_ahead", "auto"))  # auto with no costs: one ahead
    assert 0 < float(str(document["first_token_s"])) <= float(str(document["finished_s"]))


def test_ids_stream_to_stdout_and_layouts_agree(tiny_cache: Path) -> None:
    args = ["generate", "builtin:tiny", "--ids", "9,8,7", "--ladder", LADDER]
    args += ["--max-new-tokens", "40", "--ignore-eos", "--cache-dir", str(tiny_cache)]
    streamed = run(*args, "--kv-layout", "copy-and-grow")
    assert streamed.exit_code == 0, streamed.output
    tokens = [int(t) for t in streamed.stdout.split()]
    assert len(tokens) == 40 and streamed.stdout.endswith("\n")
    summary = streamed.stderr.splitlines()[-1]  # after the line on the first graph
    assert summary.startswith("40 tokens") and "KV grew 32 -> 64 tokens" in summary

    shared = generate_json(*args[1:], "--kv-layout", "shared-max")
    assert ints(shared["token_ids"]) == tokens
    boundaries = shared["boundaries"]
    assert isinstance(boundaries, list)
    # Shared-max re-strides the 32 live tokens inside its one buffer (no allocation).
    assert [b["copied_bytes"] for b in boundaries] == [32 * 512]


def test_the_remap_layout_from_the_command_line(tiny_cache: Path) -> None:
    args = ["builtin:tiny", "--ids", "9,8,7", "--ladder", "64,128", "--max-new-tokens", "90"]
    args += ["--ignore-eos", "--cache-dir", str(tiny_cache)]
    remap = generate_json(*args, "--kv-layout", "remap")
    copied = generate_json(*args, "--kv-layout", "copy-and-grow")
    assert ints(remap["token_ids"]) == ints(copied["token_ids"])
    assert (remap["kv_layout"], remap["kv_note"]) == ("remap", "")
    for document, copies in ((remap, False), (copied, True)):
        boundaries = document["boundaries"]
        assert isinstance(boundaries, list) and len(boundaries) == 1
        assert (boundaries[0]["copied_bytes"] > 0) == copies
    auto = run("generate", *args, "--load-mode", "compile", "--verbose")  # aligned rungs
    assert auto.exit_code == 0 and "KV remap" in auto.stderr
    fallback = run(
        "generate", *args[:3], "--ladder", "32,64", "--max-new-tokens", "40", *args[7:],
        "--load-mode", "compile", "--verbose",
    )  # fmt: skip
    assert fallback.exit_code == 0
    assert "KV copy-and-grow (rung 32 not page-aligned" in fallback.stderr
    plain = fallback.stderr.splitlines()[-2]  # the technical line is --verbose's, after it
    assert "page-aligned" not in plain and plain.startswith("40 tokens"), plain


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tests/data/qwen2", "Hello", "--ids", "1,2"], "exactly one of PROMPT"),
        (["tests/data/qwen2"], "exactly one of PROMPT"),
        (["builtin:tiny", "Hello"], "has no openvino_tokenizer.xml; pass --ids"),
        (
            ["tests/data/qwen2", "--ids", ",".join(["5"] * 30), "--ladder", "32"],
            "over the top rung 32",
        ),
        (["tests/data/qwen2", "--ids", "1", "--policy", "lazy"], "'--policy'"),
        (["tests/data/qwen2", "--ids", "1", "--kv-layout", "paged"], "'--kv-layout'"),
        (
            ["tests/data/qwen2", "--ids", "1", "--ladder", "32,64", "--kv-layout", "remap"],
            "cannot map rung 32",
        ),
        (["tests/data/qwen2", "--ids", "1,x"], "not a comma-separated list of token ids"),
        (["tests/data/qwen2", "--ids", "1", "--max-new-tokens", "0"], "'--max-new-tokens'"),
        (["tests/data/qwen2", ""], "the prompt is empty"),
        (["tests/data/missing", "--ids", "1"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tiny_cache: Path, tmp_path: Path
) -> None:
    cache = tiny_cache if args[0].startswith("builtin:") else tmp_path
    data = Path(__file__).parents[1] / "data"
    args = [str(data / a[len("tests/data/") :]) if a.startswith("tests/data/") else a for a in args]
    result = run("generate", *args, "--cache-dir", str(cache))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ovspec: error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


def test_help_lists_the_options() -> None:
    result = run("generate", "--help")
    assert result.exit_code == 0
    for option in (
        "MODEL [PROMPT]",
        "--ids",
        "--max-new-tokens",
        "--ladder",
        "--chunk",
        "--policy",
        "--kv-layout",
        "--device",
        "--config",
        "--cache-dir",
        "--ignore-eos",
        "--json",
    ):
        assert option in result.output


def test_cli_choices_match_the_library_enums() -> None:
    assert set(POLICY_CHOICES) == {p.value for p in Policy}
    assert set(KV_LAYOUT_CHOICES) == {k.value for k in KVLayout}


# -- the codec and the stream -------------------------------------------------------


def test_codec_round_trip_and_a_split_character(qwen2_dir: Path) -> None:
    codec = TextCodec.for_model(ModelDir.open(qwen2_dir))
    text = "héllo 你好 wörld"
    ids = codec.encode(text)
    assert codec.decode(ids) == text
    # Byte-level BPE: "你" is three byte tokens here, so a prefix ends mid-character.
    assert REPLACEMENT_CHAR in codec.decode(ids[: ids.index(codec.encode("你")[0]) + 1])
    stream = codec.stream()
    pieces = [stream.push(i) for i in ids]
    assert "" in pieces  # held back at least once
    assert all(REPLACEMENT_CHAR not in p for p in pieces)
    assert "".join(pieces) + stream.finish() == text


def test_a_tail_that_never_completes_is_released_by_finish(qwen2_dir: Path) -> None:
    codec = TextCodec.for_model(ModelDir.open(qwen2_dir))
    partial = codec.encode(" 你")[:-1]
    stream = codec.stream()
    pieces = [stream.push(i) for i in partial]
    assert REPLACEMENT_CHAR not in "".join(pieces)
    assert stream.finish().endswith(REPLACEMENT_CHAR)
    assert stream.emitted == codec.decode(partial)


def byte_decode(ids: Sequence[int]) -> str:
    """A byte-level detokenizer in miniature: each id is one byte."""
    return bytes(ids).decode("utf-8", errors="replace")


@given(st.lists(st.integers(0, 255), max_size=40) | st.text(max_size=12).map(str.encode))
def test_stream_concatenation_is_the_decoded_text(data: list[int] | bytes) -> None:
    ids = list(data)
    stream = TextStream(byte_decode)
    pieces = [stream.push(i) for i in ids]
    assert all(not p.endswith(REPLACEMENT_CHAR) for p in pieces)
    assert "".join(pieces) + stream.finish() == byte_decode(ids)


def test_stream_holds_back_exactly_the_partial_character() -> None:
    stream = TextStream(byte_decode)
    emoji = "😀".encode()
    assert [stream.push(b) for b in b"a" + emoji] == ["a", "", "", "", "😀"]
    # A byte that can never start a character is released once text follows it.
    assert stream.push(0xFF) == ""
    assert stream.push(ord("b")) == REPLACEMENT_CHAR + "b"
    assert stream.finish() == ""


def test_codec_without_a_tokenizer() -> None:
    codec = TextCodec(None, None, "builtin:tiny")
    assert not codec.can_encode and not codec.can_decode
    with pytest.raises(BadRequestError, match=r"builtin:tiny has no openvino_tokenizer\.xml"):
        codec.encode("Hello")


def _model_dir(root: Path, config: dict[str, object]) -> ModelDir:
    return ModelDir(root, root / "openvino_model.xml", root / "openvino_model.bin", config)


def test_eos_ids_from_both_configs(tmp_path: Path) -> None:
    assert eos_token_ids(_model_dir(tmp_path, {})) == frozenset()
    assert eos_token_ids(_model_dir(tmp_path, {"eos_token_id": 2})) == {2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert eos_token_ids(_model_dir(tmp_path, {"eos_token_id": 2})) == {2, 5, 7}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ModelError, match="eos_token_id 'x'"):
        eos_token_ids(_model_dir(tmp_path, {}))
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ModelError, match="not valid JSON"):
        eos_token_ids(_model_dir(tmp_path, {}))
