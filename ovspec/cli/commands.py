"""Imports every command module so each registers itself on the group."""

from ovspec.cli import (  # noqa: F401
    abcompile,
    bench,
    build,
    cache,
    chat,
    doctor,
    generate,
    patch,
    plan,
    profile,
    serve,
    sharing,
)
