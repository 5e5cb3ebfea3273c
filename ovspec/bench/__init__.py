"""The decode-protocol bench (B0/B1/I1/I2) and the build benchmark.

Owns protocol definitions, the fresh-process worker, per-run metrics, reports and
plots. Imports ``runtime``, ``compile``, ``ir``, ``store``, ``stats`` and the
primitives.
"""
