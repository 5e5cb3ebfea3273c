"""The decode-protocol bench (`ovspec bench`): B0/B1/I1/I2/I3 side by side in Williams
order, one fresh worker process per run. Owns the protocols as values, the runner, the
worker, per-run metrics, the text/JSON report and the generated page."""
