"""The model side: reading an LLM IR and turning it into static specializations.

Owns model folders and built-in model references, role discovery, stateful ->
stateless preparation, static reshapes, weight compression and the stateful reference
runner. Imports only ``ovspec.errors``, ``ovspec.ladder`` and ``ovspec.testing``
(the built-in models). GGUF input lands here too.
"""
