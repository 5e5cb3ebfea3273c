"""``ovspec serve``: an OpenAI-compatible HTTP server over continuous batching.

A workflow above the runtime: the engine thread steps a ``ContinuousBatcher``, the
FastAPI app turns OpenAI requests into batch requests and tokens into responses and
server-sent events, and the metrics expose what the batch holds.
"""
