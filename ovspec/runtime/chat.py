"""Chat prompts: one user message through the model's own chat template.

Owns turning ``--chat TEXT`` into prompt ids as openvino-genai does for
``LLMPipeline.generate(text)``: the template stored in the tokenizer IR's rt_info,
rendered by genai's tokenizer with the generation prompt appended, then encoded
without adding special tokens (the template writes them). The render runs in a child
process with a time bound: genai renders in C++ holding the GIL, and a template's loops
can run for hours (issue 29, item 9), so only a process can be stopped.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from ovspec.errors import BadRequestError, ModelError
from ovspec.ir.files import TOKENIZER_XML_NAME, read_rt_info
from ovspec.ir.model_dir import ModelDir

# Real templates render in milliseconds; the bound starts once the child has imported
# genai and read the tokenizer (that start has its own, generous bound: a loaded host).
CHAT_RENDER_S = 5.0
CHAT_START_S = 120.0
# A prompt longer than this is no chat message (and would not fit any ladder).
MAX_CHAT_TEXT_CHARS = 1 << 22
_READY = b"R"

# The child: stdin a JSON request, stdout _READY once set up, then one JSON answer.
_CHILD = r"""
import json, sys
request = json.load(sys.stdin)
out = sys.stdout.buffer
def answer(document):
    out.write(json.dumps(document).encode()); out.flush(); sys.exit(0)
try:
    import openvino_genai
    tokenizer = openvino_genai.Tokenizer(request["root"])
except ImportError:
    answer({"missing_genai": True})
except Exception as exc:
    answer({"error": f"{type(exc).__name__}: {exc}"})
out.write(b"R"); out.flush()
try:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": request["message"]}], add_generation_prompt=True
    )
    if len(text) > request["max_chars"]:
        answer({"too_long_chars": len(text)})
    encoded = tokenizer.encode(text, add_special_tokens=False)
    answer({"ids": [int(i) for i in encoded.input_ids.data.reshape(-1)]})
except Exception as exc:
    answer({"error": f"{type(exc).__name__}: {exc}"})
"""


def chat_template(model_dir: ModelDir) -> str | None:
    """The chat template the model's tokenizer IR carries, if any."""
    if model_dir.tokenizer_xml is None:
        return None
    return read_rt_info(model_dir.tokenizer_xml).get("chat_template") or None


def chat_prompt_ids(model_dir: ModelDir, message: str, model_label: str) -> list[int]:
    """Prompt ids for one user ``message`` in the model's chat format."""
    if not message:
        raise BadRequestError("the chat message is empty; give some text")
    if chat_template(model_dir) is None:
        raise BadRequestError(
            f"{model_label} has no chat template (no chat_template in its "
            f"{TOKENIZER_XML_NAME}); give a plain PROMPT instead of --chat"
        )
    request = {"root": str(model_dir.root), "message": message, "max_chars": MAX_CHAT_TEXT_CHARS}
    answer = _render_in_child(json.dumps(request).encode(), model_label)
    if answer.get("missing_genai"):
        raise ModelError(
            "--chat renders the template with openvino-genai's tokenizer: "
            "pip install 'ovspec[genai]' (or openvino-genai)"
        )
    if "too_long_chars" in answer:
        raise BadRequestError(
            f"the chat template of {model_label} renders {answer['too_long_chars']:,} "
            f"characters (over {MAX_CHAT_TEXT_CHARS:,}); fix the template or give a plain PROMPT"
        )
    if "error" in answer:
        text = " ".join(str(answer["error"]).split())[:400]
        raise ModelError(f"the chat template of {model_label} failed: {text}")
    ids = answer.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ModelError(f"rendering the chat template of {model_label} gave no token ids")
    return ids


def _render_in_child(request: bytes, model_label: str) -> dict[str, object]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(request)
        proc.stdin.close()
        fd = proc.stdout.fileno()
        first = _read_within(fd, 1, CHAT_START_S)
        if first is None:
            raise ModelError(
                f"openvino-genai did not read the tokenizer of {model_label} within "
                f"{CHAT_START_S:.0f} s; try again on a less loaded host"
            )
        rest = b"" if first != _READY else _read_within(fd, None, CHAT_RENDER_S)
        if rest is None:
            raise BadRequestError(
                f"the chat template of {model_label} did not finish within "
                f"{CHAT_RENDER_S:.0f} s (it loops too long); fix the template or give a "
                "plain PROMPT instead of --chat"
            )
        body = rest if first == _READY else first + rest
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    try:
        answer = json.loads(body.decode())
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ModelError(
            f"rendering the chat template of {model_label} ended without an answer "
            f"(exit status {code}); check the model's tokenizer files"
        )
    return answer


def _read_within(fd: int, limit: int | None, seconds: float) -> bytes | None:
    """Up to ``limit`` bytes (None: until end of file) from ``fd`` within ``seconds``;
    None when the time runs out first."""
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    got = 0
    while limit is None or got < limit:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, (limit - got) if limit is not None else 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
