"""The agent registry: given ``agentloop.agent``, the one place that names everything that agent brings.

An entry (``AgentSpec``) holds the agent's facts (the stop strings its loop acts on, whether it needs a
vision-language model, the reward scorings it accepts) and names each of its components
by import path (``"module:attr"``), imported only when asked for (``spec.load("rollout")``), so that validating a
config reads the facts without importing torch or the loops.

``agentloop.agent`` is a registered name (``AGENTS``) or the import path of an ``AgentSpec`` object
(``mypkg.agent:SPEC``), so an agent can live outside ``rlinf_ext``. Nothing else compares ``agentloop.agent``
with a name. The components, each called with the experiment config:

- ``rollout``: the class the agent-loop worker drives (``agent/core/rollout.py:AgentRollout``);
- ``dataset``: ``fn(cfg) -> (train dataset, validation dataset or None)`` of ``{"uid", "answers", "prompt_ids"}``;
- ``reward``: ``fn(response, golden_answers, reward_cfg, num_searches=0, **kw) -> result with .score and .em``;
- ``reward_metrics`` (optional): ``fn([(result, reward results), ...]) -> {metric: value}`` after a reward step;
- ``config`` (optional): the agent's own dataclass, mounted at ``agentloop.<name>`` (``config/agent_schema.py``);
- ``rules`` (optional): a module (a dotted name, no attribute) whose ``@rule(..., agent=<name>)`` checks run on
  configs that choose this agent (``config/rule_registry.py``);
- ``evaluation`` / ``validation`` (optional): ``rlinf-ext eval``'s runner, the validation pass during training;
- ``tiny_assets`` (optional): ``fn(cfg) -> assets.core.tiny.Parts`` the tiny experiments of this agent need;
- ``summary`` (optional): ``fn(metrics rows) -> [line]`` the run summary prints for it (validation per category).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.plugins import is_import_path, load_path

SEARCHR1 = "searchr1"
MMSEARCH = "mmsearch"


class AgentError(ValueError):
    """An ``agentloop.agent`` that names no usable agent: the problem, and its own ``fix``."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem} Fix: {fix}")
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class AgentSpec:
    name: str  # the key of its section, agentloop.<name>, and of its metrics
    title: str
    stops: tuple[str, ...]  # the closing tags the loop acts on besides its tools' (those follow the tools configured)
    vision: bool  # a vision-language model (images in the context)
    reward_scorings: tuple[str, ...]  # reward.scoring values its reward accepts
    rollout: str
    dataset: str
    reward: str
    reward_metrics: str = ""
    config: str = ""
    rules: str = ""
    evaluation: str = ""
    validation: str = ""
    tiny_assets: str = ""
    summary: str = ""
    tools: tuple[str, ...] = ()  # the tools it always uses, when its section lists none (agentloop.<name>.tools)
    stops_from_tools: bool = True  # its turns also stop at each configured tool's closing tag (Tool.stops())
    # its loop re-tokenises responses: the engine's log-probs are not shown to fit the trained tokens, so stale
    # rollouts (runner.max_staleness > 0), weighted by them, are refused
    retokenizes: bool = False
    summary_trends: tuple[tuple[str, str], ...] = ()  # (metric key, label): first vs last steps in the run summary
    moved_keys: tuple[tuple[str, str], ...] = ()  # (old key, new key) its section took over: named in the error

    def has(self, component: str) -> bool:
        return bool(getattr(self, component))

    def load(self, component: str) -> Any:
        """The object a component field names (``spec.load("rollout")``), imported now."""
        path = getattr(self, component)
        if not path:
            raise ValueError(f"agent {self.name!r} has no {component} component")
        return load_path(path, f"agent {self.name!r} component {component}")


AGENTS: dict[str, AgentSpec] = {
    SEARCHR1: AgentSpec(
        name=SEARCHR1,
        title="Search-R1",
        stops=("</answer>",),
        vision=False,
        reward_scorings=("em", "subem", "f1", "format"),
        rollout="rlinf_ext.agent.searchr1.rollout:SearchR1Rollout",
        dataset="rlinf_ext.data.prompts:build_prompt_datasets",
        reward="rlinf_ext.rewards.searchr1:searchr1_reward",
        config="rlinf_ext.agent.searchr1.config:SearchR1Config",
        evaluation="rlinf_ext.eval.searchr1.runner:run_evaluation",
        validation="rlinf_ext.eval.searchr1.validation:ValidationPass",
        tiny_assets="rlinf_ext.agent.searchr1.tiny:tiny_parts",
    ),
    MMSEARCH: AgentSpec(
        name=MMSEARCH,
        title="MMSearch-R1",
        stops=("</search>", "</text_search>", "</answer>"),
        vision=True,
        stops_from_tools=False,  # its loop tags its tools itself (image search </search>, text search </text_search>)
        reward_scorings=("em", "subem"),
        rollout="rlinf_ext.agent.mmsearch.rollout:MMSearchRollout",
        dataset="rlinf_ext.agent.mmsearch.dataset:build_datasets",
        reward="rlinf_ext.agent.mmsearch.reward:mmsearch_reward",
        reward_metrics="rlinf_ext.agent.mmsearch.metrics:reward_metrics",
        config="rlinf_ext.agent.mmsearch.config:MMSearchConfig",
        rules="rlinf_ext.agent.mmsearch.rules",
        evaluation="rlinf_ext.eval.mmsearch.runner:run_evaluation",
        validation="rlinf_ext.eval.mmsearch.validation:ValidationPass",
        tiny_assets="rlinf_ext.agent.mmsearch.tiny:tiny_parts",
        summary="rlinf_ext.agent.mmsearch.summary:summary_lines",
        tools=("search",),  # its text search; its loop builds the image search itself (tools/image_search.py)
        retokenizes=True,  # observations encoded with their image pads expanded (agent/mmsearch/retokenize.py)
        summary_trends=mk.MM_TRENDS,
        moved_keys=(
            ("data.image_min_pixels", "agentloop.mmsearch.image_min_pixels"),
            ("data.image_max_pixels", "agentloop.mmsearch.image_max_pixels"),
            *(
                (f"reward.{k}", f"agentloop.mmsearch.reward.{k}")
                for k in ("format_penalty", "use_search_count_penalty", "search_penalty_warmup_steps")
            ),
        ),
    ),
}


def agent_spec(cfg_or_name: Any) -> AgentSpec:
    """The entry of an agent: a registered name, an import path ``pkg.module:SPEC``, or an experiment config
    (its ``agentloop.agent``)."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else cfg_or_name.agentloop.agent
    if name in AGENTS:
        return AGENTS[name]
    key = f"agentloop.agent={name!r}"
    if not is_import_path(name):
        raise AgentError(
            f"{key} is not a registered agent.",
            f"choose one of {sorted(AGENTS)} or give the import path of an AgentSpec (pkg.module:SPEC).",
        )
    try:
        spec = load_path(name, key)
    except ValueError as exc:
        raise AgentError(str(exc), "fix the path, or put the package that defines it on PYTHONPATH.") from exc
    if not isinstance(spec, AgentSpec):
        raise AgentError(
            f"{key} names a {type(spec).__name__}, not an rlinf_ext.protocol.agents.AgentSpec.",
            "point agentloop.agent at an AgentSpec object (pkg.module:SPEC).",
        )
    if spec.name in AGENTS:
        raise AgentError(
            f"{key}: its name {spec.name!r} is a built-in agent's.",
            f"give it its own, e.g. AgentSpec(name={spec.name + '_custom'!r}, ...).",
        )
    if not spec.name.isidentifier():  # it names the section agentloop.<name> and the metrics' prefix
        fixed = re.sub(r"\W", "_", spec.name)
        fixed = fixed if fixed.isidentifier() else f"agent_{fixed}"
        raise AgentError(
            f"{key}: its AgentSpec name {spec.name!r} is not a Python identifier, and it names the "
            "config section agentloop.<name>.",
            f"use letters, digits and underscores, e.g. AgentSpec(name={fixed!r}, ...).",
        )
    return spec


def agent_section(cfg: Any) -> Any:
    """The chosen agent's own section of an experiment config (``agentloop.<name>``), or None."""
    return getattr(cfg.agentloop, agent_spec(cfg).name, None)


def agent_tools(cfg: Any) -> list[str]:
    """The tools the chosen agent calls: its section's ``tools`` list, else the ones its entry names."""
    spec = agent_spec(cfg)
    return [str(name) for name in getattr(getattr(cfg.agentloop, spec.name, None), "tools", spec.tools)]
