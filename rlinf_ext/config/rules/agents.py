"""Agent rules: an agent's parts agree with ``agentloop.agent`` (its data reader, reward and model kind), its stop
strings hold its action tags, and MMSearch-R1's own limits (search rounds, image pixels, the image-search source).
They read the agent registry; they belong with their agents."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.agent.registry import AGENTS, agent_spec
from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


@rule("agentloop.agent", "algorithm.recompute_logprobs")
def logprobs_are_recomputed(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """The trainer always recomputes the old log-probs: every agent's loop re-tokenises tool text."""
    if not cfg.algorithm.recompute_logprobs:
        yield ConfigIssue(
            "algorithm.recompute_logprobs",
            f"the {agent_spec(cfg).title} loop re-tokenises tool observations into the response, so the engine's "
            "sampled log-probs do not cover the trained tokens; the trainer always recomputes them with the actor.",
            "set algorithm.recompute_logprobs=true (the only supported value).",
        )


@rule("agentloop.agent", "reward.reward_type", "data.type", "reward.scoring", "rollout.model.model_type")
def agent_parts_agree(cfg):
    """An agent is one choice (agentloop.agent); its data reader, reward and model kind follow from the registry."""
    spec = agent_spec(cfg)
    for key, value, wanted in (("data.type", cfg.data.type, spec.data_type),
                               ("reward.reward_type", cfg.reward.reward_type, spec.reward_type)):
        if value != wanted:
            yield ConfigIssue(key, f"agentloop.agent={spec.name} ({spec.title}) reads its data and scores with "
                              f"{wanted}, but {key}={value}.", f"set {key}={wanted} (or choose another agent: "
                              f"{sorted(AGENTS)}).")
    if cfg.reward.reward_type == spec.reward_type and cfg.reward.scoring not in spec.reward_scorings:
        yield ConfigIssue("reward.scoring", f"the {spec.reward_type} reward scores {list(spec.reward_scorings)}, got "
                          f"{cfg.reward.scoring}.", f"set reward.scoring to one of {list(spec.reward_scorings)}.")
    vl = cfg.rollout.model.model_type == "qwen2.5_vl"
    if spec.vision != vl:
        need = "a vision-language model (qwen2.5_vl)" if spec.vision else "a text model"
        yield ConfigIssue("rollout.model.model_type", f"{spec.title} runs on {need}, but rollout.model.model_type="
                          f"{cfg.rollout.model.model_type}.", "use a model of the agent's kind, or choose the other "
                          "agent.")


@rule("agentloop.agent", "algorithm.sampling_params.stop")
def stops_hold_the_action_tags(cfg):
    """The loop acts when the engine stops at an action's closing tag. Every request carries the agent's stops
    (the loop adds them); a configured list that leaves one out says something the run does not do."""
    spec = agent_spec(cfg)
    configured = cfg.algorithm.sampling_params.stop or []
    missing = [t for t in spec.stops if t not in configured]
    if configured and missing:
        yield ConfigIssue("algorithm.sampling_params.stop", f"{spec.title} turns end at {list(spec.stops)}; missing "
                          f"{missing}.", f"add {missing} to algorithm.sampling_params.stop.")


@rule("agentloop.agent", "agentloop.mmsearch.max_gen_round", "agentloop.mmsearch.image_search_limit",
      "agentloop.mmsearch.text_search_limit")
def mm_search_limits_fit_the_rounds(cfg):
    """Each search takes a round and the answer needs one more: a limit at or above max_gen_round is unreachable."""
    mm = cfg.agentloop.mmsearch
    if not agent_spec(cfg).image_search or mm.max_gen_round < 1:
        return
    for key, limit in (("image_search_limit", mm.image_search_limit), ("text_search_limit", mm.text_search_limit)):
        if limit < 0 or limit > mm.max_gen_round - 1:
            yield ConfigIssue(f"agentloop.mmsearch.{key}", f"{limit} searches cannot fit max_gen_round="
                              f"{mm.max_gen_round} (each search takes a round, the answer one more).",
                              f"set agentloop.mmsearch.{key} between 0 and {max(mm.max_gen_round - 1, 0)}.")


@rule("data.image_min_pixels", "data.image_max_pixels", "tools.image_search.thumbnail_min_pixels",
      "tools.image_search.thumbnail_max_pixels")
def image_pixel_bounds(cfg):
    for lo_key, hi_key, lo, hi in (
        ("data.image_min_pixels", "data.image_max_pixels", cfg.data.image_min_pixels, cfg.data.image_max_pixels),
        ("tools.image_search.thumbnail_min_pixels", "tools.image_search.thumbnail_max_pixels",
         cfg.tools.image_search.thumbnail_min_pixels, cfg.tools.image_search.thumbnail_max_pixels),
    ):
        if lo < 28 * 28:
            yield ConfigIssue(lo_key, f"{lo} pixels is below one 28x28 block (784).", f"set {lo_key}>=784.")
        elif hi < lo:
            yield ConfigIssue(hi_key, f"{hi} is below {lo_key}={lo}.", f"set {hi_key}>={lo}.")


@rule("agentloop.agent", "tools.image_search.backend", "tools.image_search.cache_path", "agentloop.mmsearch.max_gen_round")
def image_search_source(cfg):
    if not agent_spec(cfg).image_search:
        return
    if cfg.tools.image_search.backend != "dummy" and not cfg.tools.image_search.cache_path:
        yield ConfigIssue("tools.image_search.cache_path", f"backend {cfg.tools.image_search.backend} reads a cache, "
                          "but no path is set.", "set tools.image_search.cache_path=DIR (FVQA_Cache) or FILE.pkl.")
    if cfg.agentloop.mmsearch.max_gen_round < 1:
        yield ConfigIssue("agentloop.mmsearch.max_gen_round", "must be >= 1.", "set agentloop.mmsearch.max_gen_round=3.")
