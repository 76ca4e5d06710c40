"""The engine stand-in of the warm starts: a `Generator` that "samples" the planned turns of the current task.

The warm-start data is what the real agent loop (`agent.searchr1.loop`, `agent.mmsearch.loop`) produces when
this generator plays back planned turn texts: the prompt, the observations and their ids, the masks and the
images all come from the loop's own code, exactly as in a rollout.
"""

from __future__ import annotations

from typing import Any

from rlinf_ext.protocol.generation import GenerationResult


class PlaybackGenerator:
    """The k-th call after `start(plan)` returns `plan[k]`, tokenised whole (one task at a time: sequential)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.plan, self.turn = tokenizer, [], 0

    def start(self, plan: list[str]) -> None:
        self.plan, self.turn = list(plan), 0

    async def generate(self, prompt_ids, sampling_params, images=None) -> GenerationResult:
        if self.turn >= len(self.plan):
            raise RuntimeError(f"the loop asked for turn {self.turn + 1} of a {len(self.plan)}-turn plan")
        text = self.plan[self.turn]
        self.turn += 1
        return GenerationResult(self.tokenizer.encode(text, add_special_tokens=False), text, "stop", None)
