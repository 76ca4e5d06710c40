"""Search-R1's own settings, mounted at ``agentloop.searchr1`` (``AgentSpec.config``), and ``LoopSettings``: what
the loop reads, from that section and the shared ``agentloop`` keys. Defaults live in the two dataclasses only.

Another text agent that reuses this loop (its rollout is ``agent/searchr1/rollout.py``) mounts a subclass of
``SearchR1Config`` under its own name; ``loop_section`` finds the section of whichever agent the config chose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from rlinf_ext.config.schema import AgentLoopConfig, fld
from rlinf_ext.protocol.agents import agent_section

RETRY, END = "retry", "end"  # agentloop.<agent>.on_no_action
ON_NO_ACTION = (RETRY, END)


@dataclass
class SearchR1Config:
    max_turns: int = fld(2, "Tool-calling rounds before the answer is forced.")
    force_final_answer: bool = fld(True, "After max_turns, one more turn with tool calls disabled.")
    on_no_action: Literal["retry", "end"] = fld(
        "retry",
        "A turn that ends on EOS with no action: retry = Search-R1's rule in training and evaluation "
        "(search_r1/llm_agent/generation.py): the EOS is dropped, the invalid-action message appended and the model "
        "goes on within max_turns; end = the trajectory ends on that EOS.",
    )
    tools: list[str] = fld(
        ["search"],
        "The agent's tools: registered names (search) or import paths pkg.module:Class of Tool "
        "subclasses (tools/base.py); their tags, stops and invalid-action lines follow the list.",
    )


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@dataclass(frozen=True)
class LoopSettings:
    """The Search-R1 loop's knobs (checked when built)."""

    max_turns: int = _default(SearchR1Config, "max_turns")
    force_final_answer: bool = _default(SearchR1Config, "force_final_answer")
    on_no_action: str = _default(SearchR1Config, "on_no_action")
    response_length_total: int = _default(AgentLoopConfig, "response_length_total")
    max_obs_length: int = _default(AgentLoopConfig, "max_obs_length")
    print_outputs: bool = _default(AgentLoopConfig, "print_outputs")

    def __post_init__(self) -> None:
        if int(self.max_turns) < 0:
            raise ValueError(f"agentloop.<agent>.max_turns must be >= 0, got {self.max_turns}")
        if int(self.response_length_total) < 1:
            raise ValueError(f"agentloop.response_length_total must be >= 1, got {self.response_length_total}")
        if int(self.max_obs_length) < 1:
            raise ValueError(f"agentloop.max_obs_length must be >= 1, got {self.max_obs_length}")
        if self.on_no_action not in ON_NO_ACTION:
            raise ValueError(
                f"agentloop.<agent>.on_no_action must be one of {', '.join(ON_NO_ACTION)}, got {self.on_no_action!r}"
            )
        if int(self.max_turns) == 0 and not self.force_final_answer:
            raise ValueError("agentloop.<agent>.max_turns=0 with force_final_answer=false allows no generation at all")

    @classmethod
    def from_config(cls, cfg: Any) -> "LoopSettings":
        """From an experiment config: the shared ``agentloop`` keys and the chosen agent's own section."""
        section, shared = loop_section(cfg), cfg.agentloop
        return cls(
            max_turns=int(section.max_turns),
            force_final_answer=bool(section.force_final_answer),
            on_no_action=str(section.on_no_action),
            response_length_total=int(shared.response_length_total),
            max_obs_length=int(shared.max_obs_length),
            print_outputs=bool(shared.print_outputs),
        )


def loop_section(cfg: Any) -> SearchR1Config:
    """The chosen agent's own section (``agentloop.<its name>``): Search-R1's, or that of an agent reusing its loop."""
    return agent_section(cfg)
