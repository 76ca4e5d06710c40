"""Generation rules: stop strings the engine can see, engine log-probs that mean the actor's, the range of the
behaviour weight made of them (``algorithm.off_policy``), and the sequence budget (prompt + response within
``runner.seq_length``)."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.engines import ENGINE_KEY, engine_spec


@rule("algorithm.sampling_params.stop", "rollout.detokenize")
def stop_needs_detokenize(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.algorithm.sampling_params.stop and not cfg.rollout.detokenize:
        yield ConfigIssue(
            "rollout.detokenize",
            "stop strings are set (algorithm.sampling_params.stop) but the engine does not detokenize, so it "
            "cannot see them and generation runs to EOS.",
            "set rollout.detokenize=true (or clear algorithm.sampling_params.stop).",
        )


@rule(
    "rollout.return_logprobs",
    ENGINE_KEY,
    "algorithm.sampling_params.top_p",
    "algorithm.sampling_params.top_k",
    "algorithm.sampling_params.repetition_penalty",
)
def engine_logprobs_mean_the_actors(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """The engine's log-probs are pi_behav of the behaviour weight pi_prox / pi_behav: the log-prob of the
    distribution the token was sampled from, comparable with the actor's log-softmax(logits / temperature). With
    top-k / top-p / a repetition penalty on, no engine returns that (``EngineSpec.logprobs``), so the weight would be
    off on every token; temperature alone is what the actor divides by."""
    sp = cfg.algorithm.sampling_params
    on = [
        k
        for k, off in (
            ("top_p", sp.top_p >= 1.0),
            ("top_k", sp.top_k is None or sp.top_k <= 0),
            ("repetition_penalty", sp.repetition_penalty == 1.0),
        )
        if not off
    ]
    engine = engine_spec(cfg)
    if cfg.rollout.return_logprobs and sp.do_sample and on:
        yield ConfigIssue(
            "rollout.return_logprobs",
            f"with {', '.join('algorithm.sampling_params.' + k for k in on)} on, {ENGINE_KEY}={engine.name} "
            f"returns {engine.logprobs}; the kept engine log-probs would not be the behaviour policy the "
            "actor's log-probs are compared with.",
            "set rollout.return_logprobs=false (training uses the actor's recomputed log-probs), or turn "
            + " and ".join(on)
            + " off.",
        )


@rule("algorithm.off_policy.behaviour_weight_cap", "algorithm.off_policy.behaviour_weight_floor")
def behaviour_weight_range(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """cap >= 1 >= floor > 0: on-policy tokens (w = 1) keep their weight; a cap below 1 or a floor above it would
    bias every step, even with no staleness at all."""
    off = cfg.algorithm.off_policy
    cap, floor = off.behaviour_weight_cap, off.behaviour_weight_floor
    if cap < 1.0:
        yield ConfigIssue(
            "algorithm.off_policy.behaviour_weight_cap",
            f"behaviour_weight_cap={cap} is below 1, so even on-policy tokens (w = pi_prox / pi_behav = 1) would be "
            "truncated or masked.",
            "set algorithm.off_policy.behaviour_weight_cap >= 1 (2.0 is the usual choice).",
        )
    if not 0.0 < floor <= 1.0:
        yield ConfigIssue(
            "algorithm.off_policy.behaviour_weight_floor",
            f"behaviour_weight_floor={floor} is outside (0, 1]: 'mask' mode keeps w in [floor, cap], a range that "
            "must hold on-policy tokens (w = 1); a floor of 0 or less would mask nothing below.",
            "set algorithm.off_policy.behaviour_weight_floor in (0, 1] (0.5 is the usual choice).",
        )


@rule("runner.seq_length", "data.max_prompt_length")
def seq_longer_than_prompt(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.runner.seq_length <= cfg.data.max_prompt_length:
        yield ConfigIssue(
            "runner.seq_length",
            f"runner.seq_length ({cfg.runner.seq_length}) must be greater than data.max_prompt_length "
            f"({cfg.data.max_prompt_length}); nothing would be left for the response.",
            f"raise runner.seq_length above {cfg.data.max_prompt_length} or lower data.max_prompt_length.",
        )


@rule(
    "runner.seq_length",
    "data.max_prompt_length",
    "agentloop.response_length_total",
    "algorithm.sampling_params.max_new_tokens",
)
def response_fits_sequence(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    room = cfg.runner.seq_length - cfg.data.max_prompt_length
    total = cfg.agentloop.response_length_total
    if room > 0 and total > room:
        yield ConfigIssue(
            "agentloop.response_length_total",
            f"a response of {total} tokens does not fit runner.seq_length - data.max_prompt_length = {room}.",
            f"set agentloop.response_length_total<={room} or raise runner.seq_length.",
        )
    elif room > 0 and cfg.algorithm.sampling_params.max_new_tokens > total:
        yield ConfigIssue(
            "algorithm.sampling_params.max_new_tokens",
            f"one turn ({cfg.algorithm.sampling_params.max_new_tokens} tokens) exceeds the whole response budget "
            f"agentloop.response_length_total={total}.",
            f"set algorithm.sampling_params.max_new_tokens<={total}.",
        )
