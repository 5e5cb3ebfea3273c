"""The remote tier benchmark (tools/bench_remote.py): a fresh store's time to first token
with a warm remote (a second machine, simulated on one host), against a cold compile and a
warm local store."""
