"""The KV-layout benchmark (tools/bench_kv.py): remap against copy-and-grow at a boundary
(`boundaries`) and through a real decode (`decode`), and the page rendered from its
results (`page`)."""
