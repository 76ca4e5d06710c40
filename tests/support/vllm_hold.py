"""``HeldAfter``: holds the real in-process vLLM engine (``generation/vllm_engine.py:InprocVLLMEngine``) after a
given number of steps, so that a test's weight sync lands at a known token of a turn (partial rollout)."""

from __future__ import annotations

import time
from typing import Any


class HeldAfter:
    """The engine's later steps step nothing until ``release``: a lone request has then sampled exactly ``n`` tokens
    (its first step prefills and samples one). Only the ``LLMEngine`` instance's ``step`` is wrapped (an instance
    attribute, removed on release); vLLM's class is untouched."""

    def __init__(self, inproc: Any, n: int):
        self.llm, self.n, self.steps = inproc.engine, n, 0
        self.step, self.released = self.llm.step, False
        self.llm.step = self._step

    def _step(self):
        if self.steps >= self.n and not self.released:
            time.sleep(0.001)
            return []
        self.steps += 1
        return self.step()

    @property
    def reached(self) -> bool:
        return self.steps >= self.n

    def release(self) -> None:
        if not self.released:
            self.released = True
            del self.llm.step
