"""The generality sweep (tools/sweep.py): I1 against I2 across model sizes, ladders and
precisions, each cell a small protocol bench; the grid, its runs and its page."""
