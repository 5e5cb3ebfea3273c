"""The NPU weights page: its verdicts follow the saved peaks (imported rungs and the decode
arms), and results from before the decode arms still render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ovspec.bench.npu.weights_page import MIB, decode_ratio, render

PAGES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def _decode(arm: str, rungs: list[int], peaks_mib: list[int]) -> dict[str, Any]:
    generations = [{"peak_rss_bytes": p * MIB, "load_s": [0.25, 0.5]} for p in peaks_mib]
    return {"arm": arm, "rungs": rungs, "generations": generations}


def _results(kept_peaks_mib: list[int]) -> dict[str, Any]:
    saved = json.loads((PAGES / "results" / "npu-weights.json").read_text(encoding="utf-8"))
    return {
        **saved,
        "decode_properties": {"NPUW_DEVICES": "CPU"},
        "prompt_tokens": 16,
        "decodes": [
            _decode("released", [512], [200, 220]),
            _decode("released", [64, 512], [190, 230]),
            _decode("kept", [512], [200, 200]),
            _decode("kept", [64, 512], kept_peaks_mib),
        ],
    }


def test_the_decode_verdicts_follow_the_peaks() -> None:
    results = _results([300, 300])
    assert decode_ratio(results["decodes"], "released", 0) == 0.95
    page = render(results)
    assert "- `released`: 0.95× after the first generation, 1.05× after 2 (met)" in page
    assert "- `kept`: 1.50× after the first generation, 1.50× after 2 (not met)" in page
    assert "| kept | 2 | 300, 300 | 2 in 0.75 s; 2 in 0.75 s |" in page
    assert "(met)" in render(_results([230, 240])).split("`kept`")[-1]


def test_results_from_before_the_decode_arms_render_without_them() -> None:
    saved = json.loads((PAGES / "results" / "npu-weights.json").read_text(encoding="utf-8"))
    assert "decodes" not in saved or saved["decodes"]
    page = render({k: v for k, v in saved.items() if k != "decodes"})
    assert "## Decoding through the ladder" not in page
    assert "Peak RSS of the ladder over one rung's" in page
