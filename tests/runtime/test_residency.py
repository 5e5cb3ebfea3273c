"""The IR's mapped weights leave the resident set once graphs have packed them, and
decoding gives the same tokens with or without them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import ovspec
from ovspec.ir.reference import EXACT_CPU_PROPERTIES
from ovspec.runtime import vmem
from ovspec.runtime.decoding import decode
from ovspec.runtime.residency import WeightPageTrimmer, read_only_mappings
from ovspec.store.local import Store

needs_madvise = pytest.mark.skipif(
    WeightPageTrimmer.unsupported_reason() is not None,
    reason=f"no page mapping here: {WeightPageTrimmer.unsupported_reason()}",
)


def test_only_read_only_mappings_of_the_file_count(tmp_path: Path) -> None:
    weights = tmp_path / "w eights.bin"  # a space: the path is the line's whole tail
    weights.write_bytes(b"0" * 10)
    link = tmp_path / "link.bin"
    link.symlink_to(weights)
    real = os.path.realpath(weights)
    maps = "\n".join(
        [
            f"7f0000000000-7f0000100000 r--s 00000000 08:01 12 {real}",
            f"7f0000200000-7f0000201000 rw-p 00000000 08:01 12 {real}",  # written: kept
            "7f0000300000-7f0000400000 r--p 00000000 08:01 13 /other/w eights.bin",
            "7f0000500000-7f0000600000 rw-p 00000000 00:00 0 ",
            f"7f0000700000-7f0000702000 r--p 00100000 08:01 12 {real}",
        ]
    )
    expected = [(0x7F0000000000, 0x100000), (0x7F0000700000, 0x2000)]
    assert read_only_mappings(link, maps) == expected
    assert read_only_mappings(tmp_path / "missing.bin", maps) == []


def _mapped_weight_bytes(bin_path: Path) -> tuple[int, int]:
    """(bytes of the file's read-only mappings, how many of them are resident)."""
    with open("/proc/self/maps") as f:
        spans = read_only_mappings(bin_path, f.read())
    return sum(size for _, size in spans), vmem.smaps_rss_bytes(spans)


def _decode_and_measure(
    tiny_dir: Path, store: Store, trim: bool, prompt: list[int]
) -> tuple[list[int], int, int]:
    """Tokens, and the .bin's mapped and resident bytes after the decode (waiting up to
    2 s for the trimmer's next poll)."""
    with ovspec.open(
        tiny_dir,
        ladder="64,128",
        properties=EXACT_CPU_PROPERTIES,
        store=store,
        prefill_chunk_tokens=16,
        trim_weight_pages=trim,
    ) as loader:
        result = decode(loader, prompt, max_new_tokens=80)
        deadline = time.monotonic() + 2.0
        mapped, resident = _mapped_weight_bytes(tiny_dir / "openvino_model.bin")
        while trim and resident and time.monotonic() < deadline:
            time.sleep(0.05)
            mapped, resident = _mapped_weight_bytes(tiny_dir / "openvino_model.bin")
    return list(result.token_ids), mapped, resident


@needs_madvise
def test_decode_drops_the_weights_pages_and_keeps_its_tokens(tiny_dir: Path, store: Store) -> None:
    prompt = np.random.default_rng(5).integers(3, 2048, 40).tolist()
    kept_tokens, kept_mapped, kept_resident = _decode_and_measure(tiny_dir, store, False, prompt)
    # The control: without the trimmer the packed weights' pages stay resident.
    assert kept_mapped > 0 and kept_resident > kept_mapped // 2
    tokens, mapped, resident = _decode_and_measure(tiny_dir, store, True, prompt)
    assert mapped > 0  # the weights are still mapped: only their pages went
    step_bytes = (tiny_dir / "openvino_model.bin").stat().st_size // 8
    assert resident <= step_bytes
    assert tokens == kept_tokens


@needs_madvise
def test_drop_reports_what_it_advised(tmp_path: Path) -> None:
    import mmap

    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(1 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        before = bytes(m[:4096])
        trimmer = WeightPageTrimmer.for_file(path)
        assert trimmer.step_mib == pytest.approx(1 / 8)
        assert _mapped_weight_bytes(path)[1] > 0
        assert trimmer.drop() == 1 << 20
        assert _mapped_weight_bytes(path)[1] == 0
        assert bytes(m[:4096]) == before  # read back from the page cache
        assert trimmer.drops == 1
