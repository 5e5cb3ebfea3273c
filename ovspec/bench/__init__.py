"""The decode-protocol bench (B0/B1/I1/I2), the build benchmark and the store's fault
campaign.

Owns protocol definitions, the fresh-process worker, per-run metrics, reports and
plots, and the fault classes run through real ``ovspec`` processes (``faults``).
Imports ``runtime``, ``compile``, ``ir``, ``store``, ``stats`` and the primitives.
"""
