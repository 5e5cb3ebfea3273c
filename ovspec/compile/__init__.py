"""Compiling specializations for a device, through the store.

Owns the ``Compiler`` (keys from named components, build into the store, import from
memory-mapped blobs), device facts and blob-neutral properties, the host's CPU name,
the prewarm workflow behind ``ovspec build`` and the fresh-process compile worker of
compiler trials. Imports ``ir``, ``store`` and the primitives.
"""
