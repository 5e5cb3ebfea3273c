"""Imports every command module so each registers itself on the group."""

from ovspec.cli import build, cache  # noqa: F401
