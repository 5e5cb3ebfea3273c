"""The chat benchmark: a 10-turn conversation with a long system prompt, ovspec's kept
conversation (and its prefix cache) against openvino-genai's chat mode on the same IR."""
