"""The remote tier benchmark (tools/bench_remote.py): a second machine's time to first
token with a warm remote, against a cold compile and a warm local store."""
