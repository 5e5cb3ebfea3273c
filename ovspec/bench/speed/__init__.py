"""The speed benchmark (tools/bench_speed.py): ovspec's loader against openvino-genai's
`LLMPipeline` on the same IR. Owns the runner, the arm run in a fresh process, the
statistics over token times and the page."""
