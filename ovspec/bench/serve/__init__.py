"""The serving benchmark: a seeded trace of requests driven through ``ovspec serve`` by
the official openai client (batch 1 and batched) and through openvino-genai's
``ContinuousBatchingPipeline``, raw per-token samples kept, and the page rendered from them.
"""
