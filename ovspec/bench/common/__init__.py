"""What every benchmark shares: the environment a figure was measured in (host, load,
commit, the process's resources), the shared records, the generated pages' registry
(each page rendered from its saved results) and the PNG plots."""
