"""Helpers for the test suite and the benchmarks, never for a user's command.

``gguf`` writes tiny GGUF files (llama, qwen2) that openvino-genai reads; ``seaweed``
runs a throwaway S3 server (SeaweedFS) for the remote tier's tests and benchmark. The
``builtin:`` models are a product feature and live in ``ovspec.builtin``.
"""
