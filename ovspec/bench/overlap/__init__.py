"""The overlap benchmark (tools/bench_overlap.py): what host-core work costs the split's
decode, measured inside one decode (`runner`, with background `load` processes) and
judged and rendered from the results (`analysis`)."""
