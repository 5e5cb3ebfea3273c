"""ovspec's benchmarks, one folder each, and what they share.

``protocols`` is ``ovspec bench`` (B0/B1/I1/I2/I3); ``profile`` is ``ovspec profile``;
``build``, ``faults``, ``kv``, ``overlap``, ``remote``, ``speed`` and ``sweep`` run from
tools/. ``common`` holds the shared pieces: the environment, records, the generated
pages' registry and the plots. Imports ``runtime``, ``compile``, ``ir``, ``store``,
``stats`` and the primitives.
"""
