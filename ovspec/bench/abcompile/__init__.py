"""The compiler A/B page (tools/bench_abcompile.py): ``ovspec ab-compile`` trials whose
raw run records are saved as results/ab-compile.json and rendered into ab-compile.md."""
