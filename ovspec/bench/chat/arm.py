"""One arm of the chat benchmark in a fresh process: a JSON request on argv, one JSON
result on stdout. ``ovspec``: a ``Conversation`` on the paged path, then one that puts the
system prompt in the prefix cache, one that starts from it, and a cold prefill of the
system prompt alone; ``genai``: ``LLMPipeline`` on its default CPU backend given the whole
conversation's token ids each turn (that backend keeps no history for token ids: its
prefix cache keeps the earlier turns' KV, as for its ``ChatHistory`` chat). Under a
lockstep coordinator each arm stops itself once loaded and after every turn
(``lockstep.checkpoint``), so the two arms' turns alternate, one process running.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from ovspec.bench.common.lockstep import checkpoint


def _turns(request: dict[str, Any]) -> list[list[int]]:
    system, users = request["system_ids"], request["user_ids"]
    return [[*system, *users[0]], *users[1:]]


def _ovspec(request: dict[str, Any]) -> dict[str, Any]:
    from ovspec.runtime.conversation import Conversation
    from ovspec.runtime.decoding import open as open_loader
    from ovspec.runtime.prefixcache import PrefixCache
    from ovspec.runtime.sampling import GenerationConfig

    config = GenerationConfig(max_new_tokens=request["answer_tokens"], ignore_eos=True)
    system, users = request["system_ids"], request["user_ids"]
    turns: list[dict[str, Any]] = []
    with open_loader(
        request["model_dir"],
        ladder=request["ladder"],
        store=request["store"],
        prefill_chunk_tokens=request["chunk_tokens"],
        properties=request["properties"],
    ) as loader:
        # The chat itself does not store its system prompt in the cache: a marked prefix
        # is prefilled as a call of its own, and turn 1 then differs from genai's one call
        # by rounding (the message's attention reads the system prompt's K/V from the u8
        # cache), which flips a greedy near-tie. A separate, untimed conversation fills it.
        cache = PrefixCache()  # in memory: the figure is the hit, not the disk read
        checkpoint(request.get("idle_s", 0.0))  # loaded
        with Conversation(loader) as conversation:
            conversation.append(system)
            for i, user in enumerate(users):
                conversation.append(user)
                turn = conversation.generate(config)
                # A turn's own tokens: its message, and the system prompt (turn 1) or the
                # last answer's final token (pending until now); the rest came before.
                own = len(user) + (len(system) if i == 0 else 1)
                new_boundaries = conversation.track.boundaries[-turn.boundaries :]
                turns.append(
                    {
                        "first_token_s": turn.first_token_s,
                        "prefilled_tokens": turn.prefilled_tokens,
                        "earlier_refed_tokens": max(0, turn.prefilled_tokens - own),
                        "boundary_wait_s": sum(
                            b.program_wait_s for b in new_boundaries if turn.boundaries
                        ),
                        "capacity_tokens": turn.capacity_tokens,
                        "token_ids": list(turn.token_ids),
                    }
                )
                checkpoint(request.get("idle_s", 0.0))
        with Conversation(loader, prefix_cache=cache) as seed:
            seed.append(system, cache_prefix=True)
            seed.generate(GenerationConfig(max_new_tokens=1, ignore_eos=True))
        with Conversation(loader, prefix_cache=cache) as warm:
            warm.append(system, cache_prefix=True)
            warm.append(users[0])
            hit = warm.generate(config)
        with Conversation(loader) as cold:
            cold.append(system)
            cold_prefill = cold.generate(config)
    return {
        "turns": turns,
        "prefix_hit_first_token_s": hit.first_token_s,
        "prefix_hit_reused_tokens": hit.reused_tokens,
        "cold_system_prefill_s": cold_prefill.first_token_s,
    }


def _genai(request: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import openvino as ov
    import openvino_genai

    pipe = openvino_genai.LLMPipeline(request["model_dir"], "CPU", **request["properties"])
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = request["answer_tokens"]
    config.ignore_eos = True
    config.do_sample = False
    config.apply_chat_template = False
    turns: list[dict[str, Any]] = []

    class FirstToken(openvino_genai.StreamerBase):  # type: ignore[misc]
        """Token ids as they come: a text streamer would need a detokenizer, which the
        built-in presets do not ship."""

        def __init__(self) -> None:
            super().__init__()
            self.began = time.perf_counter()
            self.first_s: float | None = None

        def write(self, token: Any) -> Any:
            if self.first_s is None:
                self.first_s = time.perf_counter() - self.began
            return openvino_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    # start_chat() does not help here: with token ids, genai's continuous-batching backend
    # answers each generate() as a new request and keeps no history, so a turn given only
    # its own ids would be answered without the conversation. The whole conversation goes
    # in; its prefix cache (on by default) finds the earlier turns' blocks.
    history: list[int] = []
    checkpoint(request.get("idle_s", 0.0))  # loaded
    for ids in _turns(request):
        history += ids
        array = np.array(history, dtype=np.int64)[None]
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(array), ov.Tensor(np.ones_like(array)))
        streamer = FirstToken()
        out = pipe.generate(inputs, config, streamer=streamer)
        answer = [int(t) for t in out.tokens[0]]
        history += answer
        turns.append(
            {
                "first_token_s": streamer.first_s,
                "prompt_tokens": int(array.shape[1]),
                "token_ids": answer,
            }
        )
        checkpoint(request.get("idle_s", 0.0))
    return {"turns": turns}


def run(request: dict[str, Any]) -> dict[str, Any]:
    began = time.perf_counter()
    result = _ovspec(request) if request["arm"] == "ovspec" else _genai(request)
    result["wall_s"] = time.perf_counter() - began
    return result


def main(argv: Sequence[str]) -> None:
    print(json.dumps(run(json.loads(argv[0]))))


if __name__ == "__main__":
    main(sys.argv[1:])
