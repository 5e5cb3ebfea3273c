"""Synthetic test models written by ovspec itself (nothing is downloaded).

``qwen2`` builds seeded Qwen2 IRs with optimum-intel's stateful conventions (the
``builtin:`` presets). Imports only ``ovspec.errors``; OpenVINO is loaded when a
model is built.
"""

from ovspec.testing.qwen2 import PRESETS, ModelSpec, build_model, write_model

__all__ = ["PRESETS", "ModelSpec", "build_model", "write_model"]
