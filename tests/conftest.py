"""Shared fixtures: the copied optimum-intel exports, a direct (store-less) program
source, and the guard that makes a run with too few tests fail instead of pass."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openvino as ov
import pytest
from hypothesis import settings

from ovspec.compile.halves import compile_halves
from ovspec.compile.sharedhead import CutCompiledModel, embedding_chunk, is_cut
from ovspec.ir.headcut import embedding_model, head_model
from ovspec.ir.partition import split_in_two
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.ir.rewrites import RewriteSet
from ovspec.ir.specialize import DynamicLLM, Specialization, prepare, read_ir, serving_spec
from ovspec.store.local import Store

if TYPE_CHECKING:
    from ovspec.testing.seaweed import SeaweedServer

# Hypothesis's default 200 ms per example counts time the process spends descheduled: one
# stall on a loaded CI machine would fail a property that holds. Examples stay bounded by
# their count, not by the clock.
settings.register_profile("ovspec", deadline=None)
settings.load_profile("ovspec")

DATA = Path(__file__).parent / "data"
FIXTURE_NAMES = ("qwen2", "llama")


class DirectPrograms:
    """Compiles each specialization once on CPU, no store: the simplest ``Programs``.
    With ``rung_chunk_tokens`` every rung's decode runs on its 1..P prefill graph, as
    ``LoadMode.COMPILE`` serves the prompt's rung (later rungs there get static decode
    graphs, the ``one_graph=False`` cases). With ``halves`` every graph is compiled as
    two halves run one after the other (``compile/halves.py``). Graphs whose LM head
    and embedding were cut out share them (``compile/sharedhead.py``)."""

    def __init__(
        self,
        llm: DynamicLLM,
        properties: dict[str, str] | None = None,
        rewrites: RewriteSet | None = None,
        rung_chunk_tokens: int | None = None,
        halves: bool = False,
    ) -> None:
        self.llm = llm
        self.halves = halves
        self.properties = dict(EXACT_CPU_PROPERTIES if properties is None else properties)
        self.rewrites = rewrites or RewriteSet()
        self.rung_chunk_tokens = rung_chunk_tokens
        self.compiled: dict[Specialization, Any] = {}
        self.core = ov.Core()
        self.parts: dict[str, ov.CompiledModel] = {}

    def get(self, spec: Specialization) -> Any:
        # Every rung decodes on its prefill graph (as the prompt's rung does in COMPILE mode).
        spec = serving_spec(spec, self.rung_chunk_tokens, spec.capacity_tokens)
        if spec not in self.compiled:
            model = self.llm.specialize(spec, self.rewrites)
            if self.halves:
                cut = split_in_two(model, self.llm.roles)
                assert cut is not None, "every fixture has layers enough to halve"
                self.compiled[spec] = compile_halves(self.core, cut, "CPU", self.properties)
            else:
                self.compiled[spec] = self.core.compile_model(model, "CPU", self.properties)
            body = self.compiled[spec]
            chunk = embedding_chunk(body)
            head = lookup = None  # the shared head and embedding rewrites' parts
            if is_cut(body):
                head = self._part("head", lambda: head_model(self.llm.model, self.llm.roles))
            if chunk is not None:
                lookup = self._part(
                    f"embedding:{chunk}",
                    lambda: embedding_model(self.llm.model, self.llm.roles, chunk),
                )
            if head is not None or lookup is not None:
                self.compiled[spec] = CutCompiledModel(body, head, lookup)
        return self.compiled[spec]

    def _part(self, label: str, make: Callable[[], ov.Model]) -> ov.CompiledModel:
        """A shared part, compiled once (made only when asked for)."""
        if label not in self.parts:
            self.parts[label] = self.core.compile_model(make(), "CPU", self.properties)
        return self.parts[label]

    def release(self, spec: Specialization) -> None:
        pass  # tests keep every graph


@pytest.fixture(autouse=True)
def _no_remote_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's OVSPEC_REMOTE or AWS_* settings must not reach the suite (obstore
    reads AWS_* itself); tests that want them set them."""
    for name in list(os.environ):
        if name.startswith(("OVSPEC_REMOTE", "AWS_")):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One real S3 server (SeaweedFS on 127.0.0.1) for the session; tests isolate
    themselves by prefix (tests/s3server.py)."""
    from s3server import BUCKET

    from ovspec.testing.seaweed import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A strict temp store; the store's own self-check is the oracle at teardown."""
    s = Store(tmp_path / "store", strict=True)
    yield s
    assert s.check() == []
    s.close()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tiny Qwen2 model, written once per test session."""
    from ovspec.builtin import PRESETS, write_model

    return write_model(PRESETS["tiny"], tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session", params=FIXTURE_NAMES)
def fixture_dir(request: pytest.FixtureRequest) -> Path:
    return DATA / str(request.param)


@pytest.fixture(scope="session")
def qwen2_dir() -> Path:
    return DATA / "qwen2"


# Tiny GGUF files (written by the suite): both architectures openvino-genai reads, F16
# and a quantized type each.
GGUF_CASES = (("llama", "F16"), ("llama", "Q8_0"), ("qwen2", "F16"), ("qwen2", "Q4_0"))


@pytest.fixture(scope="session", params=GGUF_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ovspec.testing.gguf import write_gguf

    arch, quant = request.param
    folder = tmp_path_factory.mktemp("gguf")
    return write_gguf(arch, folder / f"tiny-{arch}-{quant}.gguf", quant, seed=1)


def load_llm(model_dir: Path) -> DynamicLLM:
    return prepare(read_ir(model_dir / "openvino_model.xml"))


def no_kv_graph() -> ov.Model:
    """A graph with an LLM's inputs and logits but no KV cache (what ovspec must refuse)."""
    ids = ov.opset13.parameter([-1, -1], ov.Type.i64, name="input_ids")
    ids.output(0).set_names({"input_ids"})
    mask = ov.opset13.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    mask.output(0).set_names({"attention_mask"})
    logits = ov.opset13.convert(ov.opset13.add(ids, mask), ov.Type.f32)
    logits.output(0).set_names({"logits"})
    return ov.Model([logits], [ids, mask], "no_kv")


# A full run (no arguments) that collects fewer tests than this failed to import or
# find something: fail it rather than pass quietly. Raise it as the suite grows.
MIN_TESTS_FULL_RUN = 1000


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    full_run = not session.config.invocation_params.args
    minimum = int(os.environ.get("OVSPEC_MIN_TESTS", MIN_TESTS_FULL_RUN if full_run else 0))
    if minimum and session.testscollected < minimum:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\novspec: only {session.testscollected} tests collected, expected >= {minimum}")
