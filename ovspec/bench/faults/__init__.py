"""The store's fault campaign (tools/faults.py): faults injected from outside ovspec and
observed through real `ovspec` processes. Owns the harness, the fault cases and the
table they print."""
