"""Engine-free stand-ins for tests and dry runs: a character tokenizer and a scripted generator.

`ScriptedGenerator` plays back fixed turn texts but behaves like a real engine at the boundary: it honours
`stop` strings (cutting right after the earliest one), `max_new_tokens` (finish "length") and EOS, so a
loop that forgets to pass a stop string gets text past the stop, as it would from SGLang.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlinf_ext.protocol.generation import GenerationResult, SamplingParams


class CharTokenizer:
    """One id per character (id = code point + 1); id 0 is EOS, decoded as `<eos>`."""

    eos_token_id = 0
    eos_token = "<eos>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith(self.eos_token, i):
                ids.append(self.eos_token_id)
                i += len(self.eos_token)
            else:
                ids.append(ord(text[i]) + 1)
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(
            ("" if skip_special_tokens else self.eos_token) if i == self.eos_token_id else chr(i - 1) for i in ids
        )


@dataclass
class GenerateCall:
    prompt_ids: list[int]
    params: SamplingParams
    result: GenerationResult


@dataclass
class ScriptedGenerator:
    """The k-th call (counted over all callers) gets `script[k]`, or `script(k, prompt_text)` if callable
    (a callable can look at the context, e.g. to script many concurrent trajectories)."""

    script: Sequence[str] | Callable[[int, str], str]
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    delay_s: float = 0.0
    calls: list[GenerateCall] = field(default_factory=list)

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams) -> GenerationResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        k = len(self.calls)
        text = self.script(k, self.tokenizer.decode(prompt_ids)) if callable(self.script) else self.script[k]
        result = self.emulate_engine(text, sampling_params)
        self.calls.append(GenerateCall(list(prompt_ids), sampling_params, result))
        return result

    def emulate_engine(self, text: str, params: SamplingParams) -> GenerationResult:
        ids = self.tokenizer.encode(text)
        # Walk token by token like an engine: stop at EOS, at the end of a stop string, or at the budget.
        for n in range(1, len(ids) + 1):
            if n > params.max_new_tokens:
                break
            if ids[n - 1] == self.tokenizer.eos_token_id:
                out = ids[:n]
                return GenerationResult(out, self.tokenizer.decode(out), "eos", None, [-0.5] * n)
            produced = self.tokenizer.decode(ids[:n])
            for stop in params.stop:
                if produced.endswith(stop):
                    out = ids[:n]
                    return GenerationResult(out, produced, "stop", stop, [-0.5] * n)
        out = ids[: params.max_new_tokens]
        return GenerationResult(out, self.tokenizer.decode(out), "length", None, [-0.5] * len(out))


class ForcedActions:
    """A transformers `LogitsProcessor` that makes any (even random) model follow the Search-R1 protocol:
    the first turn samples `<search> QUERY </search>`, a turn after an observation samples
    `<answer> ANSWER </answer>`; once the turn's closing tag is out, sampling is free again (so an engine
    that does not stop there keeps generating, as a real model would). Stateless and batch-safe: the
    position in the plan is read from the sequence (after the last `<|im_start|>`, the assistant turn).
    For dry runs and benchmarks with tiny random models; the engine itself is untouched."""

    def __init__(self, tokenizer, query: str, answer: str, turn_marker: str = "<|im_start|>"):
        tag = tokenizer.convert_tokens_to_ids
        self.marker = tag(turn_marker)
        self.close_information = tag("</information>")
        encode = lambda text: tokenizer.encode(f" {text} ", add_special_tokens=False)  # noqa: E731
        self.plans = {
            "search": [tag("<search>"), *encode(query), tag("</search>")],
            "answer": [tag("<answer>"), *encode(answer), tag("</answer>")],
        }

    def __call__(self, input_ids, scores):
        import torch

        forced = scores.clone()
        for row, seq in enumerate(input_ids.tolist()):
            assistant = seq[len(seq) - seq[::-1].index(self.marker) :] if self.marker in seq else seq
            observed = self.close_information in assistant
            turn = (
                assistant[len(assistant) - assistant[::-1].index(self.close_information) :] if observed else assistant
            )
            plan = self.plans["answer" if observed else "search"]
            if plan[-1] in turn:
                continue  # this turn's action is complete: free sampling
            step = next(k for k in range(len(plan) - 1, -1, -1) if k == 0 or turn[-k:] == plan[:k])
            forced[row] = torch.full_like(scores[row], float("-inf"))
            forced[row, plan[step]] = 0.0
        return forced


class ForcedFirstTurn:
    """A transformers `LogitsProcessor` that makes any (even random) model open its first assistant turn with
    ``text`` (e.g. MMSearch-R1's image-search call), then leaves sampling free, later turns included: a random
    model's trajectories that take a chosen first action, for tests that need such trajectories and not a
    trained model. The first turn is a sequence with no more turn markers than the fewest seen so far (the
    prompt's; each observation adds a user and an assistant turn). For one chat layout of prompts per instance."""

    def __init__(self, tokenizer, text: str, turn_marker: str = "<|im_start|>"):
        self.marker = tokenizer.convert_tokens_to_ids(turn_marker)
        self.plan = tokenizer.encode(text, add_special_tokens=False)
        self.prompt_markers: int | None = None

    def __call__(self, input_ids, scores):
        import torch

        rows = input_ids.tolist()
        fewest = min(seq.count(self.marker) for seq in rows)
        self.prompt_markers = fewest if self.prompt_markers is None else min(self.prompt_markers, fewest)
        forced = scores.clone()
        for row, seq in enumerate(rows):
            if seq.count(self.marker) > self.prompt_markers:
                continue  # a later turn: free
            turn = seq[len(seq) - seq[::-1].index(self.marker) :] if self.marker in seq else seq
            done = next((k for k in range(len(self.plan), -1, -1) if k == 0 or turn[-k:] == self.plan[:k]))
            if done == len(self.plan):
                continue  # the call is out: free sampling (the engine's stop string ends the turn)
            forced[row] = torch.full_like(scores[row], float("-inf"))
            forced[row, self.plan[done]] = 0.0
        return forced
