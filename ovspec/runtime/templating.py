"""Whole conversations through the model's chat template, rendered by openvino-genai's
tokenizer in one child process kept for the conversation (a render per turn costs
milliseconds, not a process start). Each render has a time bound; a child that overruns
it is killed and the next render starts a new one (see ``runtime.chat`` for why a
process).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from ovspec.errors import BadRequestError, ModelError
from ovspec.ir.model_dir import ModelDir
from ovspec.runtime.chat import CHAT_RENDER_S, CHAT_START_S, chat_template

# The child: one JSON line per request on stdin, one JSON line per answer on stdout.
_CHILD = r"""
import json, sys
def answer(document):
    sys.stdout.write(json.dumps(document) + "\n"); sys.stdout.flush()
try:
    import openvino_genai
    tokenizer = openvino_genai.Tokenizer(sys.argv[1])
except ImportError:
    answer({"missing_genai": True}); sys.exit(0)
except Exception as exc:
    answer({"error": f"{type(exc).__name__}: {exc}"}); sys.exit(0)
answer({"ready": True})
for line in sys.stdin:
    request = json.loads(line)
    try:
        text = tokenizer.apply_chat_template(
            request["messages"], add_generation_prompt=request["generation_prompt"]
        )
        ids = tokenizer.encode(text, add_special_tokens=False).input_ids.data.reshape(-1)
        answer({"ids": [int(i) for i in ids]})
    except Exception as exc:
        answer({"error": f"{type(exc).__name__}: {exc}"})
"""

Message = Mapping[str, str]


class ChatRenderer:
    """Token ids of a message list in ``model_dir``'s chat format."""

    def __init__(self, model_dir: ModelDir, model_label: str) -> None:
        if chat_template(model_dir) is None:
            raise BadRequestError(
                f"{model_label} has no chat template (no chat_template in its tokenizer IR); "
                "chat needs one"
            )
        self._root = str(model_dir.root)
        self._label = model_label
        self._child: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def render(self, messages: Sequence[Message], generation_prompt: bool = True) -> list[int]:
        child = self._started()
        request = {"messages": [dict(m) for m in messages], "generation_prompt": generation_prompt}
        assert child.stdin is not None
        child.stdin.write(json.dumps(request).encode() + b"\n")
        child.stdin.flush()
        answer = self._answer(CHAT_RENDER_S)
        if answer is None:
            self.close()
            raise BadRequestError(
                f"the chat template of {self._label} did not finish within "
                f"{CHAT_RENDER_S:.0f} s (it loops too long); fix the template"
            )
        if "error" in answer:
            text = " ".join(str(answer["error"]).split())[:400]
            raise ModelError(f"the chat template of {self._label} failed: {text}")
        ids = answer.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ModelError(f"rendering the chat template of {self._label} gave no token ids")
        return ids

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self.close()
        self._child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self._root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        answer = self._answer(CHAT_START_S)
        if answer is None or answer.get("missing_genai") or "error" in answer:
            self.close()
            if answer is not None and answer.get("missing_genai"):
                raise ModelError(
                    "chat renders the template with openvino-genai's tokenizer: "
                    "pip install 'ovspec[genai]' (or openvino-genai)"
                )
            why = "" if answer is None else f": {answer['error']}"
            raise ModelError(f"openvino-genai could not read the tokenizer of {self._label}{why}")
        return self._child

    def _answer(self, seconds: float) -> dict[str, object] | None:
        """The child's next JSON line within ``seconds``; None when time runs out or the
        child ends without one."""
        assert self._child is not None and self._child.stdout is not None
        fd = self._child.stdout.fileno()
        deadline = time.monotonic() + seconds
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def close(self) -> None:
        child, self._child, self._buffer = self._child, None, b""
        if child is None:
            return
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ChatRenderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
