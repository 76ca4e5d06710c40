"""Rules of batches dispatched ahead of training (``runner.max_staleness = k``): k > 0 needs engines that overlap
with the actor, the engine's log-probs (the behaviour policy of the off-policy correction) and an agent whose
log-probs line up with the trained tokens; without a behaviour weight it is accepted with a warning. Dynamic
sampling's refill (``algorithm.max_num_gen_batches > 1``) with k > 0 is refused by ``config/rules/dynamic_sampling.py``."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.placement import PlacementError, is_collocated
from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol.agents import MMSEARCH

KEY = "runner.max_staleness"


@rule(KEY)
def staleness_is_not_negative(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.runner.max_staleness < 0:
        yield ConfigIssue(KEY, f"{KEY}={cfg.runner.max_staleness}: a batch cannot be dispatched after the step that "
                          "trains it.", f"set {KEY}=0 (synchronous) or a positive k.")


@rule(KEY, "runner.task_type", "cluster.num_nodes", "cluster.num_gpus_per_node", "cluster.component_placement")
def staleness_needs_separate_gpus(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Collocated, the actor and the engine take turns on the same GPUs: nothing overlaps, the batches in flight
    would only hold the engine awake through training."""
    try:
        collocated = is_collocated(cfg)
    except PlacementError:  # reported by the placement rule
        return
    if cfg.runner.max_staleness > 0 and is_training(cfg) and collocated:
        yield ConfigIssue(KEY, f"{KEY}={cfg.runner.max_staleness} dispatches batches while the actor trains, but the "
                          "actor and the rollout share their GPUs (collocated) and take turns: nothing can overlap.",
                          f"set {KEY}=0, or place the actor and the rollout on disjoint GPUs "
                          "(cluster.component_placement).")


@rule(KEY, "runner.task_type", "rollout.return_logprobs")
def staleness_needs_engine_logprobs(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A batch sampled on older weights is corrected by pi_prox / pi_behav per token; pi_behav is the engine's
    log-probs of the sampled tokens."""
    if cfg.runner.max_staleness > 0 and is_training(cfg) and not cfg.rollout.return_logprobs:
        yield ConfigIssue(KEY, f"{KEY}={cfg.runner.max_staleness} trains on tokens sampled by older weights, whose "
                          "behaviour log-probs come from the engine, but rollout.return_logprobs=false.",
                          f"set rollout.return_logprobs=true, or {KEY}=0.")


@rule(KEY, "runner.task_type", "rollout.return_logprobs", "algorithm.off_policy.behaviour_weight")
def staleness_wants_a_behaviour_weight(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A warning: with ``behaviour_weight: none`` the clip is anchored on the proximal policy but nothing corrects
    for the tokens having been sampled by older weights (AReaL's decoupled loss without its weight): biased. Peers
    switch a correction on whenever rollouts run ahead (NeMo-RL's async guide calls it required for convergence)."""
    weight = "algorithm.off_policy.behaviour_weight"
    k = cfg.runner.max_staleness
    unweighted = cfg.algorithm.off_policy.behaviour_weight == "none"
    if k > 0 and is_training(cfg) and cfg.rollout.return_logprobs and unweighted:
        yield ConfigIssue(
            weight, f"{KEY}={k} trains tokens sampled by weights up to {k} step(s) old, and {weight}=none leaves "
            "them uncorrected (no pi_prox / pi_behav weight): the gradient is biased by their staleness.",
            f"set {weight}=truncate (or mask), or {KEY}=0; keep none only to measure the uncorrected loss.",
            warning=True)


@rule(KEY, "runner.task_type", "agentloop.agent")
def staleness_needs_aligned_logprobs(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """MMSearch-R1's loop re-tokenises its responses (image pads): no test shows yet that the engine's log-probs
    stay aligned with the trained tokens there."""
    if cfg.runner.max_staleness > 0 and is_training(cfg) and cfg.agentloop.agent == MMSEARCH:
        yield ConfigIssue(KEY, f"{KEY}={cfg.runner.max_staleness} needs the engine's log-probs aligned with the trained "
                          f"tokens; agent {MMSEARCH} re-tokenises its responses and that alignment is not tested yet.",
                          f"set {KEY}=0 for agentloop.agent={MMSEARCH}.")


PARTIAL = "runner.partial_rollout"
# the engines whose turns a sync can cut: HF between decode steps, vLLM by its keep pause (generation/vllm_engine.py).
# SGLang: not wired; its worker's gate waits for the turns and stamps each reply with one version (0.5.23's
# TokenizerManager.pause_generation(mode="retract") and per-token weight_versions spans are the way to it)
PARTIAL_BACKENDS = ("hf", "vllm")


@rule(PARTIAL, KEY, "runner.task_type", "rollout.rollout_backend")
def partial_rollout_needs_batches_ahead(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A sync cuts turns in flight only when batches are in flight during it (k >= 1), and only on an engine that
    stops them and goes on from their tokens so far (``PARTIAL_BACKENDS``)."""
    if not (cfg.runner.partial_rollout and is_training(cfg)):
        return
    if cfg.runner.max_staleness < 1:
        yield ConfigIssue(PARTIAL, f"{PARTIAL}=true at {KEY}={cfg.runner.max_staleness}: no turn is in flight when "
                          "the weights sync (the synchronous order), so there is nothing to cut.",
                          f"set {KEY}=1 or more, or {PARTIAL}=false.")
    backend = cfg.rollout.rollout_backend
    if backend not in PARTIAL_BACKENDS:
        yield ConfigIssue(PARTIAL, f"{PARTIAL}=true with rollout.rollout_backend={backend}: this engine's turns "
                          "cannot be cut by a sync yet (only " + ", ".join(PARTIAL_BACKENDS) + "'s).",
                          f"set rollout.rollout_backend to one of {', '.join(PARTIAL_BACKENDS)}, or {PARTIAL}=false "
                          "(the sync then waits for the turns).")


@rule("runner.in_flight_batches", KEY)
def in_flight_batches_fit_the_bound(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Group admission trains every group within k steps of its dispatch: more than k + 1 batches untrained at once
    could not all be trained in time."""
    n, k = cfg.runner.in_flight_batches, cfg.runner.max_staleness
    if n != -1 and not 1 <= n <= k + 1:
        yield ConfigIssue("runner.in_flight_batches", f"runner.in_flight_batches={n} with {KEY}={k}: between 1 and "
                          f"k + 1 = {k + 1} batches can be untrained at once and still be trained within k steps.",
                          f"set runner.in_flight_batches to 1..{k + 1}, or -1 (k + 1).")
