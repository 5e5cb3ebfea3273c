"""The model side: reading an LLM IR and turning it into static specializations.

Owns model folders and built-in model references, role discovery, stateful ->
stateless preparation, static reshapes, weight compression and the stateful reference
runner. Imports only ``ovspec.errors``, ``ovspec.ladder`` and ``ovspec.builtin``
(the built-in models). GGUF files are read here (built into an IR once by
openvino-genai), and ``diagnose`` runs the pipeline stage by stage for ``ovspec doctor``.
"""
