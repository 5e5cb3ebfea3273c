"""The paged path (``load_mode="paged"``): one PagedAttention graph from the IR for the
prompt and every step, the KV in block arrays grown rung by rung; exact against the
fixtures' stateful references, typed as the compiled graph wants, refused where it
cannot run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from click.testing import CliRunner

import ovspec
import ovspec.cli.commands
from ovspec.cli import cli
from ovspec.compile.halves import HalvedCompiledModel
from ovspec.compile.modes import LoadMode
from ovspec.compile.split import usable_cores
from ovspec.errors import BadRequestError, LadderError, ModelError
from ovspec.ir.paged import KEY_CACHE_PREFIX, paged_model
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ladder import Ladder
from ovspec.runtime import vmem
from ovspec.runtime.blockkv import BLOCK_TOKENS, BlockKV, cache_layouts
from ovspec.runtime.decoding import decode, open_rungs
from ovspec.runtime.loader import EventKind
from ovspec.runtime.paged import BoundInputs, PagedLoader, computes_in_f32


def test_greedy_tokens_and_logits_are_the_stateful_references(
    fixture_dir: Path, tmp_path: Path
) -> None:
    reference = np.load(fixture_dir / "reference.npz")
    prompt = [int(t) for t in reference["prompt_ids"]]
    with ovspec.open(
        fixture_dir,
        ladder="32,64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=tmp_path,
        load_mode="paged",
        prefill_chunk_tokens=5,  # a 16-token prompt in four chunks
    ) as loader:
        assert isinstance(loader, PagedLoader) and loader.load_mode is LoadMode.PAGED
        result = decode(loader, prompt, max_new_tokens=64, keep_logits=lambda _s, _l: True)
    assert list(result.token_ids) == [int(t) for t in reference["generated_ids"]]
    worst = max(
        float(np.max(np.abs(result.logits[s] - reference["step_logits"][s]))) for s in range(64)
    )
    assert worst < 1e-4
    prefill_calls = [s for s in result.steps if s.prefill]
    assert [s.new_tokens for s in prefill_calls] == [5, 5, 5, 1]
    # One graph, compiled once; the KV grew at each boundary in place (its range was
    # reserved up to the request's reach), or, where pages cannot be mapped, by copying
    # its live blocks.
    assert [e.kind for e in result.events].count(EventKind.COMPILED) == 1
    assert result.rungs == (32, 64, 128) and result.kv_layout == "paged"
    assert result.boundaries
    for boundary in result.boundaries:
        migration = boundary.migration
        if vmem.unsupported_reason() is None:
            assert migration.copied_bytes == 0
            assert migration.peak_reserved_bytes == migration.allocated_bytes
            continue
        live_blocks = math.ceil(migration.live_tokens / BLOCK_TOKENS)
        total_blocks = math.ceil(migration.from_capacity_tokens / BLOCK_TOKENS)
        old_bytes = migration.peak_reserved_bytes - migration.allocated_bytes
        assert migration.copied_bytes == old_bytes * live_blocks // total_blocks
    reserved = dict(result.reserved_kv)
    per_block = reserved[prompt_len := len(prompt)] // math.ceil(32 / BLOCK_TOKENS)
    assert reserved[prompt_len] == per_block * (32 // BLOCK_TOKENS)
    # The last rung (128) is reserved only as far as the request reaches: 16 + 63 fed back.
    reachable_blocks = math.ceil((prompt_len + 64 - 1) / BLOCK_TOKENS)
    assert reachable_blocks < 128 // BLOCK_TOKENS
    assert result.reserved_kv[-1][1] == per_block * reachable_blocks


@pytest.mark.parametrize("ceiling_tokens", [None, 256])
def test_block_kv_grows_in_place_under_its_ceiling_else_by_copying(
    ceiling_tokens: int | None,
) -> None:
    layouts = {"key_cache.0": (ov.Shape([2, BLOCK_TOKENS, 4]), ov.Type.f32)}
    kv = BlockKV(layouts, 64, ceiling_tokens=ceiling_tokens)
    before = kv.arrays()["key_cache.0"]
    before[:2] = np.arange(before[:2].size, dtype=np.uint8).reshape(2, -1)
    kv.live_tokens = 2 * BLOCK_TOKENS
    migration = kv.grow(128, 100)
    after = kv.arrays()["key_cache.0"]
    assert len(after) == math.ceil(100 / BLOCK_TOKENS) and kv.reserved_tokens == 100
    assert np.array_equal(after[:2], before[:2])  # the live blocks kept
    in_place = ceiling_tokens is not None and vmem.unsupported_reason() is None
    assert (after.ctypes.data == before.ctypes.data) is in_place
    assert migration.copied_bytes == (0 if in_place else before[:2].nbytes)
    kv.grow(512)  # past the ceiling: copied into new arrays
    assert np.array_equal(kv.arrays()["key_cache.0"][:2], before[:2])
    kv.close()


def test_the_kv_arrays_take_the_type_the_compiled_graph_chose(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    """Under the device's own defaults (bf16, u8 or f32 by the machine) the blocks are
    typed as the plugin compiled them, whatever numpy can spell."""
    with ovspec.open(qwen2_dir, ladder="32,64", store=tmp_path, load_mode="paged") as loader:
        assert isinstance(loader, PagedLoader)
        result = decode(loader, [1, 2, 3, 4], max_new_tokens=40)
        sequence = loader.sequence(32)
        try:
            compiled = {
                p.get_any_name(): p.get_element_type() for p in sequence.request.model_inputs
            }
            bound = sequence.kv.tensors()
            assert bound and all(name.startswith(("key_cache.", "value_cache.")) for name in bound)
            assert {n: t.element_type for n, t in bound.items()} == {n: compiled[n] for n in bound}
        finally:
            sequence.close()
    assert len(result.token_ids) == 40 and result.rungs == (32, 64)


def test_open_compiles_the_graph_on_a_thread_before_the_first_request(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    """The compile starts at ``open`` (the caller's work overlaps it) and the request
    then runs on that graph: one compile, its tokens those of a foreground compile."""
    with ovspec.open(qwen2_dir, "32,64", store=tmp_path, load_mode="paged") as loader:
        waited_s = 0.0
        while EventKind.COMPILED not in [e.kind for e in loader.events] and waited_s < 60:
            time.sleep(0.05)
            waited_s += 0.05
        assert [e.kind for e in loader.events].count(EventKind.COMPILED) == 1
        ahead = decode(loader, list(range(1, 20)), max_new_tokens=8)
        assert [e.kind for e in ahead.events].count(EventKind.COMPILED) == 1
    assert isinstance(loader, PagedLoader)
    foreground = PagedLoader(qwen2_dir / "openvino_model.xml", loader.ladder, "CPU", {}, 128)
    with foreground:
        assert not foreground.events  # nothing compiles before it is asked
        alone = decode(foreground, list(range(1, 20)), max_new_tokens=8)
    assert alone.token_ids == ahead.token_ids


def test_the_graph_in_two_halves_gives_the_whole_graphs_logits(
    fixture_dir: Path,
) -> None:
    """Halves compiled side by side (what ``open`` does with two cores) run as the
    whole graph: same tokens, same logits at every step, KV blocks of the same types."""
    reference = np.load(fixture_dir / "reference.npz")
    prompt = [int(t) for t in reference["prompt_ids"]]
    results = {}
    for halve in (False, True):
        loader = PagedLoader(
            fixture_dir / "openvino_model.xml",
            Ladder.parse("32,64"),
            "CPU",
            dict(EXACT_CPU_PROPERTIES),
            5,
            halve_graph=halve,
        )
        with loader:
            results[halve] = decode(
                loader, prompt, max_new_tokens=40, keep_logits=lambda _s, _l: True
            )
            compiled = loader._compiled
            assert isinstance(compiled, HalvedCompiledModel) is halve
            layouts = cache_layouts(compiled)  # type: ignore[arg-type]
            if halve:  # each half holds its own layers' blocks
                front = {p.get_any_name() for p in compiled.front.inputs}  # type: ignore[union-attr]
                assert 0 < len(front & set(layouts)) < len(layouts)
    whole, halves = results[False], results[True]
    assert halves.token_ids == whole.token_ids
    for step, logits in whole.logits.items():
        np.testing.assert_allclose(halves.logits[step], logits, rtol=0, atol=1e-5)
    notes = [e.note for e in halves.events if e.kind is EventKind.COMPILED]
    assert notes and "two halves" in notes[0]


def test_halves_are_compiled_only_where_the_device_computes_in_f32() -> None:
    assert computes_in_f32("CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert not computes_in_f32("CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    assert not computes_in_f32("CPU", {"INFERENCE_PRECISION_HINT": "f16"})
    assert computes_in_f32("CPU", {"EXECUTION_MODE_HINT": "ACCURACY"})
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert computes_in_f32("CPU", {}) is (default == "f32")


def test_a_loader_closed_while_reading_ahead_compiles_nothing(qwen2_dir: Path) -> None:
    loader = PagedLoader(qwen2_dir / "openvino_model.xml", Ladder.parse("32"), "CPU", {}, 128)
    loader.read_ahead()
    loader.close()  # before compile_ahead: the thread stops after its read
    assert not loader.events
    with pytest.raises(LadderError, match="closed"):
        loader.start()


def test_a_stateless_ir_is_one_clear_error(tmp_path: Path) -> None:
    parameter = ov.opset13.parameter([1, 4], ov.Type.f32, name="x")
    model = ov.Model([ov.opset13.relu(parameter)], [parameter], "stateless")
    ov.save_model(model, tmp_path / "m.xml")
    with pytest.raises(ModelError, match="stateless IR"):
        paged_model(tmp_path / "m.xml")


def test_the_paged_graph_has_one_cache_pair_per_layer(qwen2_dir: Path) -> None:
    paged = paged_model(qwen2_dir / "openvino_model.xml")
    keys = [n for n in paged.cache_inputs if n.startswith(KEY_CACHE_PREFIX)]
    config = json.loads((qwen2_dir / "config.json").read_text())
    assert len(keys) * 2 == len(paged.cache_inputs) == 2 * config["num_hidden_layers"]
    assert paged.vocab_tokens == config["vocab_size"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "NPU", "properties": {"NPUW_DEVICES": "CPU"}}, "runs PagedAttention"),
        ({"kv_layout": "remap"}, "keeps its KV in blocks"),
        ({"tuning": ovspec.Tuning(halve_prompt_graph=True)}, "does not compile rung graphs"),
        ({"compression": "int8"}, "compiles the IR's own weights"),
        ({"rewrites": "none"}, "compiles the IR's own weights"),
        ({"properties": {"NUM_STREAM": "2"}}, "did you mean NUM_STREAMS"),
    ],
)
def test_what_the_paged_path_cannot_take_is_refused_before_a_compile(
    qwen2_dir: Path, tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(BadRequestError, match=message):
        ovspec.open(qwen2_dir, ladder="32,64", store=tmp_path, load_mode="paged", **options)


def test_the_split_is_refused_with_it(qwen2_dir: Path, tmp_path: Path) -> None:
    """On one core the split itself is refused first; on more, its need for imports."""
    one_core = len(usable_cores()) < 2
    message = "needs at least 2 usable cores" if one_core else "needs load_mode=import, not paged"
    with pytest.raises(BadRequestError, match=message):
        tuning = ovspec.Tuning(split=True)
        ovspec.open(qwen2_dir, "32,64", store=tmp_path, load_mode="paged", tuning=tuning)


def test_work_that_measures_rungs_refuses_it(qwen2_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="has no rungs"):
        open_rungs(qwen2_dir, "32,64", store=tmp_path, load_mode="paged")
    with open_rungs(qwen2_dir, "32,64", store=tmp_path) as loader:  # unasked: rung graphs
        assert loader.load_mode is LoadMode.COMPILE


@pytest.mark.parametrize(
    ("options", "mode"),
    [
        ({}, LoadMode.PAGED),  # CPU's default
        ({"kv_layout": "copy-and-grow"}, LoadMode.COMPILE),  # what only rung graphs have
        ({"compression": "int8"}, LoadMode.COMPILE),
        ({"rewrites": "none"}, LoadMode.COMPILE),
        ({"tuning": ovspec.Tuning(trim_weight_pages=True)}, LoadMode.COMPILE),
        ({"device": "NPU", "properties": {"NPUW_DEVICES": "CPU"}}, LoadMode.IMPORT),
    ],
)
def test_the_default_is_paged_on_cpu_unless_rung_graphs_are_asked_for(
    qwen2_dir: Path, tmp_path: Path, options: dict[str, object], mode: LoadMode
) -> None:
    with ovspec.open(qwen2_dir, "32,64", store=tmp_path, **options) as loader:  # type: ignore[arg-type]
        assert loader.load_mode is mode


def test_a_request_over_the_top_rung_is_refused(qwen2_dir: Path, tmp_path: Path) -> None:
    with (
        ovspec.open(qwen2_dir, ladder="32", store=tmp_path, load_mode="paged") as loader,
        pytest.raises(BadRequestError, match="over the top rung 32"),
    ):
        decode(loader, list(range(1, 20)), max_new_tokens=20)


def test_generate_runs_it_from_the_cli_with_the_compiled_paths_tokens(tmp_path: Path) -> None:
    def generate(*extra: str) -> dict[str, object]:
        result = CliRunner().invoke(
            cli,
            [
                "generate",
                "builtin:tiny",
                "--ids",
                "1,2,3,4,5,6,7,8",
                "--ladder",
                "32,64",
                "--max-new-tokens",
                "40",
                "--cache-dir",
                str(tmp_path),
                "--json",
                *(f"--config={k}={v}" for k, v in EXACT_CPU_PROPERTIES.items()),
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        document: dict[str, object] = json.loads(result.stdout)
        return document

    paged, compiled = generate("--load-mode", "paged"), generate("--load-mode", "compile")
    assert paged["load_mode"] == "paged" and paged["rungs"] == [32, 64]
    assert paged["token_ids"] == compiled["token_ids"]


def test_a_call_rebinds_only_the_inputs_whose_shape_changed() -> None:
    bound: list[tuple[str, ov.Tensor]] = []

    class Recording:
        def set_tensor(self, name: str, tensor: ov.Tensor) -> None:
            bound.append((name, tensor))

    inputs = BoundInputs(Recording())
    inputs.put("past_lens", np.array([7], np.int32))
    inputs.put("past_lens", np.array([8], np.int32))  # same shape: written in place
    assert [name for name, _ in bound] == ["past_lens"]
    assert bound[0][1].data.tolist() == [8]  # the bound tensor shares the written memory
    inputs.put("block_indices", np.arange(2, dtype=np.int32))
    inputs.put("block_indices", np.arange(3, dtype=np.int32))  # a new block: rebound
    inputs.put("past_lens", np.array([8], np.int64))  # another type: rebound
    assert [name for name, _ in bound] == [
        "past_lens",
        "block_indices",
        "block_indices",
        "past_lens",
    ]
    assert bound[2][1].data.tolist() == [0, 1, 2]
