"""The prompt YAML of `rlinf-ext preprocess` (examples/searchr1/prompt.yaml) as a typed dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

SEARCHR1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


@dataclass
class PromptConfig:
    template: str = field(default=SEARCHR1_TEMPLATE, metadata={"help": "User message; must contain {question}."})
    append_question_mark: bool = field(default=True, metadata={"help": "Add '?' to questions that lack one."})
    apply_chat_template: bool = field(default=True, metadata={"help": "Wrap with the tokenizer's chat template."})
    system_prompt: str | None = field(default=None, metadata={
        "help": "System message; null = the chat template's default (Qwen2.5 adds its own)."})
    max_prompt_length: int = field(default=4096, metadata={"help": "Drop prompts longer than this (tokens)."})
    question_marker: str = field(default="Question: ", metadata={
        "help": "When a row has no question field, the question is read after the last occurrence of this "
                "marker in its prompt (Search-R1 parquet and RLinf jsonl rows carry templated prompts)."})

    def __post_init__(self) -> None:
        if "{question}" not in self.template:
            raise ValueError("prompt template must contain the placeholder {question}")
        if self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {self.max_prompt_length}")


def load_prompt_config(path: str | Path | None, **overrides) -> PromptConfig:
    data = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of prompt settings, got {type(data).__name__}")
    known = {f.name for f in fields(PromptConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown prompt settings {unknown}; known: {sorted(known)}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return PromptConfig(**data)
