"""The package version, in one place (the root package, the CLI and run records read it)."""

__version__ = "0.1.0"
