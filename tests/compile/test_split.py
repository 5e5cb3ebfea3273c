"""The device/host split: core sets, pinning, the host build process and the decode's
imports through the store (tiny model; no timed assertions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ovspec.runtime.decoding as runtime
from ovspec.compile.split import CoreSplit, thread_affinities, usable_cores
from ovspec.errors import BadRequestError
from ovspec.runtime.loader import EventKind
from ovspec.store.local import Store

MODEL = Path(__file__).parents[1] / "data" / "qwen2"
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]

needs_two_cores = pytest.mark.skipif(len(usable_cores()) < 2, reason="the split needs 2 cores")


def test_core_split_validates_and_parses() -> None:
    cores = usable_cores()
    with pytest.raises(BadRequestError, match="overlap"):
        CoreSplit((cores[0],), (cores[0],))
    with pytest.raises(BadRequestError, match="at least one device core"):
        CoreSplit((), (cores[0],))
    with pytest.raises(BadRequestError, match="outside this process's affinity"):
        CoreSplit((cores[0],), (max(cores) + 1000,))
    with pytest.raises(BadRequestError, match="DEVICE/HOST"):
        CoreSplit.parse("0,1")
    if len(cores) >= 2:
        split = CoreSplit.parse(f"{cores[0]}/{cores[1]}")
        assert split == CoreSplit((cores[0],), (cores[1],))
        assert CoreSplit.from_json(split.to_json()) == split
        default = CoreSplit.default()
        assert default is not None
        assert set(default.device) | set(default.host) == set(cores)
        assert not set(default.device) & set(default.host)


def test_split_refuses_compile_mode(tmp_path: Path) -> None:
    with pytest.raises(BadRequestError, match="needs load_mode=import"):
        runtime.open(MODEL, ladder="32,64", store=tmp_path / "s", load_mode="compile", split=True)


@needs_two_cores
def test_split_pins_builds_on_the_host_and_decodes_the_same_tokens(tmp_path: Path) -> None:
    cores = usable_cores()
    split = CoreSplit((cores[0],), (cores[1],))
    before = os.sched_getaffinity(0)
    with runtime.open(MODEL, ladder="32,64,128", store=tmp_path / "split", split=split) as loader:
        builder = loader.compiler.host_builder
        assert builder is not None
        assert builder.pid != os.getpid() and builder.affinity == split.host
        assert os.sched_getaffinity(0) == set(split.device)  # the decode thread
        assert loader.compiler.properties["INFERENCE_NUM_THREADS"] == "1"
        result = runtime.decode(loader, PROMPT, max_new_tokens=70)
        # Every thread OpenVINO made in this process follows the device cores; only the
        # loader's worker (waiting for the host, importing) runs on the host cores.
        affinities = set(thread_affinities().values())
        assert affinities <= {split.device, split.host}
        assert split.device in affinities
    assert os.sched_getaffinity(0) == before  # restored on close
    compiled = [e for e in result.events if e.kind is EventKind.COMPILED]
    assert {e.spec for e in compiled} >= {"decode@32", "decode@64", "decode@128"}
    assert all(e.build_s >= e.seconds > 0 for e in compiled)  # the host's whole build
    # The host published every graph into the store; this process imported them.
    with Store(tmp_path / "split") as store:
        assert len(store.entries()) == len({e.spec for e in compiled})
    with runtime.open(MODEL, ladder="32,64,128", store=tmp_path / "plain") as loader:
        plain = runtime.decode(loader, PROMPT, max_new_tokens=70)
    assert result.token_ids == plain.token_ids
    assert result.rungs == plain.rungs == (32, 64, 128)
