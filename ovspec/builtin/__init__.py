"""The ``builtin:`` models: synthetic Qwen2 decoders ovspec writes itself (nothing is
downloaded), so every command runs on a fresh machine.

``presets`` holds the shapes and seeded weights behind ``builtin:NAME``; ``qwen2`` builds
their IRs with optimum-intel's stateful conventions. Imports only ``ovspec.errors``;
OpenVINO is loaded when a model is built.
"""

from ovspec.builtin.presets import PRESETS, ModelSpec, generate_weight, generate_weights
from ovspec.builtin.qwen2 import build_model, write_model, write_model_files

__all__ = [
    "PRESETS",
    "ModelSpec",
    "build_model",
    "generate_weight",
    "generate_weights",
    "write_model",
    "write_model_files",
]
