"""Synthetic test models written by ovspec itself (nothing is downloaded).

``presets`` holds the shapes and seeded weights behind the ``builtin:`` models;
``qwen2`` builds their IRs with optimum-intel's stateful conventions. Imports only
``ovspec.errors``; OpenVINO is loaded when a model is built. ``gguf`` writes tiny GGUF
files (llama, qwen2) that openvino-genai reads. ``seaweed`` runs a throwaway S3 server
(SeaweedFS) for the remote tier's tests and benchmark.
"""

from ovspec.testing.presets import PRESETS, ModelSpec, generate_weight, generate_weights
from ovspec.testing.qwen2 import build_model, write_model

__all__ = [
    "PRESETS",
    "ModelSpec",
    "build_model",
    "generate_weight",
    "generate_weights",
    "write_model",
]
