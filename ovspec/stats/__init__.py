"""Statistics for paired trials and counterbalanced run orders (AB/BA, Williams).

Pure Python and numpy/scipy: no OpenVINO, no other ovspec package but ``errors``.
"""
