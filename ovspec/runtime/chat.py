"""Chat prompts: one user message through the model's own chat template.

Owns turning ``--chat TEXT`` into prompt ids as openvino-genai does for
``LLMPipeline.generate(text)``: the template stored in the tokenizer IR's rt_info,
rendered by genai's tokenizer with the generation prompt appended, then encoded
without adding special tokens (the template writes them).
"""

from __future__ import annotations

from ovspec.errors import BadRequestError, ModelError, openvino_message
from ovspec.ir.files import TOKENIZER_XML_NAME, read_rt_info
from ovspec.ir.model_dir import ModelDir


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
    try:
        import openvino_genai
    except ImportError as exc:
        raise ModelError(
            "--chat renders the template with openvino-genai's tokenizer: "
            "pip install 'ovspec[genai]' (or openvino-genai)"
        ) from exc
    try:
        tokenizer = openvino_genai.Tokenizer(str(model_dir.root))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True
        )
        encoded = tokenizer.encode(text, add_special_tokens=False)
    except RuntimeError as exc:
        raise ModelError(
            f"the chat template of {model_label} failed: {openvino_message(exc)}"
        ) from exc
    return [int(i) for i in encoded.input_ids.data.reshape(-1)]
