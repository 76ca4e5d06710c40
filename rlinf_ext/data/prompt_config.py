"""The prompt YAML of `rlinf-ext preprocess` (examples/searchr1/prompt.yaml) as a typed dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
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
TOOLS_PLACEHOLDER = "{tool_instructions}"


@dataclass
class PromptConfig:
    template: str = field(default=SEARCHR1_TEMPLATE, metadata={"help": "User message; must contain {question}."})
    append_question_mark: bool = field(default=True, metadata={"help": "Add '?' to questions that lack one."})
    apply_chat_template: bool = field(default=True, metadata={"help": "Wrap with the tokenizer's chat template."})
    system_prompt: str | None = field(
        default=None, metadata={"help": "System message; null = the chat template's default (Qwen2.5 adds its own)."}
    )
    max_prompt_length: int = field(default=4096, metadata={"help": "Drop prompts longer than this (tokens)."})
    question_marker: str = field(
        default="Question: ",
        metadata={
            "help": "When a row has no question field, the question is read after the last occurrence of this "
            "marker in its prompt (Search-R1 parquet and RLinf jsonl rows carry templated prompts)."
        },
    )
    tools: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Tools, named as in agentloop.<agent>.tools, whose `instruction` sentences replace "
            "{tool_instructions} in the template: a new tool reaches the prompt without editing the template."
        },
    )

    def __post_init__(self) -> None:
        if "{question}" not in self.template:
            raise ValueError("prompt template must contain the placeholder {question}")
        if bool(self.tools) != (TOOLS_PLACEHOLDER in self.template):
            raise ValueError(
                f"prompt tools {self.tools} and a template {'with' if self.tools else 'without'} "
                f"{TOOLS_PLACEHOLDER}: the tools' sentences go where the template has that placeholder. Fix: "
                + (
                    "put {tool_instructions} in the template, or drop tools."
                    if self.tools
                    else "list the tools (prompt YAML `tools:` or --tools), or remove the placeholder."
                )
            )
        if self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {self.max_prompt_length}")


def with_tool_instructions(cfg: PromptConfig) -> PromptConfig:
    """``cfg`` with {tool_instructions} in its template replaced by its tools' instruction sentences, space-joined
    in the order listed (each tool's `Tool.invalid_action_line`, the sentence the loop also shows on a bad action)."""
    if not cfg.tools:
        return cfg
    # lazy: a plug-in tool's module is imported only when named
    from rlinf_ext.tools.registry import ToolNameError, resolve_tool

    try:
        sentences = " ".join(resolve_tool(name).invalid_action_line() for name in cfg.tools)
    except ToolNameError as exc:
        raise ValueError(f"prompt tools: {exc.problem}. Fix: {exc.fix}") from None
    return replace(cfg, template=cfg.template.replace(TOOLS_PLACEHOLDER, sentences), tools=[])


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
