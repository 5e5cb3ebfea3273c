"""One background load for the overlap benchmark, in its own process on the host cores:
``python -m ovspec.bench.overlap.load CONFIG.json``. It pins itself, prepares, writes
``ready`` on stdout, then works until killed; the benchmark stops and continues it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ovspec.errors import OvspecError

COPY_BYTES = 64 << 20  # well past the L3: every copy streams from DRAM


def _compiler(config: dict[str, Any], store_root: str) -> Any:
    from ovspec.compile.compiler import Compiler
    from ovspec.ir.model_dir import ModelDir
    from ovspec.store.local import Store

    store = Store(store_root)
    return Compiler(
        ModelDir.open(config["model_dir"]), config["device"], config["properties"], store
    )


def _build_loop(config: dict[str, Any], scratch: Path) -> None:
    """What the host does under the split: build the successors into a fresh store."""
    from ovspec.ir.specialize import Specialization

    _ready()
    while True:
        root = tempfile.mkdtemp(prefix="round-", dir=scratch)
        compiler = _compiler(config, root)
        try:
            for capacity in config["capacities"]:
                compiler.build(Specialization.decode(capacity))
        finally:
            compiler.close()
            compiler.store.close()
        shutil.rmtree(root, ignore_errors=True)


def _import_loop(config: dict[str, Any], scratch: Path) -> None:
    """Import one stored decode blob over and over (the decode-side half of a load)."""
    from ovspec.ir.specialize import Specialization

    compiler = _compiler(config, str(scratch / "store"))
    outcome = compiler.build(Specialization.decode(config["capacities"][0]))
    _ready()
    while True:
        model, backing = compiler.import_blob(outcome.path)
        del model, backing


def _memcpy_loop() -> None:
    import numpy as np

    source = np.ones(COPY_BYTES // 8)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in before the first slot
    _ready()
    while True:
        np.copyto(target, source)


def _ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ovspec.bench.overlap.load CONFIG.json", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    # Pinned before OpenVINO starts, so every thread it makes stays on the host cores.
    from ovspec.compile.split import pin_process

    pin_process(config["host_cores"])
    scratch = Path(config["scratch"])
    try:
        if config["load"] == "build":
            _build_loop(config, scratch)
        elif config["load"] == "import":
            _import_loop(config, scratch)
        elif config["load"] == "memcpy":
            _memcpy_loop()
        else:
            print(f"overlap load: unknown load {config['load']!r}", file=sys.stderr)
            return 2
    except OvspecError as exc:
        print(f"overlap load {config['load']}: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
