"""Compiler A/B trials and the compiler patch.

Owns arms (interpreters, libraries, environments, properties), the counterbalanced
trial runner, its report, and applying/reverting the npu_compiler patch. Imports
``compile``, ``ir``, ``store``, ``stats`` and the primitives.
"""
