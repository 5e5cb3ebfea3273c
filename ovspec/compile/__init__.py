"""Compiling specializations for a device, through the store.

Owns the ``Compiler`` (keys from named components, build into the store or through a
build delegate, import from memory-mapped blobs), the device profiles (``devices/``:
every per-device decision), the device/host split, the host's CPU name, the prewarm
workflow behind ``ovspec build`` and the fresh-process compile worker of compiler
trials. Imports ``ir``, ``store`` and the primitives.
"""
