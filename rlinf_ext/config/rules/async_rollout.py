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
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.protocol.engines import ENGINE_KEY, engine_spec, engines_with

KEY = "runner.max_staleness"


@rule(KEY)
def staleness_is_not_negative(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.runner.max_staleness < 0:
        yield ConfigIssue(
            KEY,
            f"{KEY}={cfg.runner.max_staleness}: a batch cannot be dispatched after the step that trains it.",
            f"set {KEY}=0 (synchronous) or a positive k.",
        )


@rule(KEY, "runner.task_type", "cluster.num_nodes", "cluster.num_gpus_per_node", "cluster.component_placement")
def staleness_needs_separate_gpus(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Collocated, the actor and the engine take turns on the same GPUs: nothing overlaps, the batches in flight
    would only hold the engine awake through training."""
    try:
        collocated = is_collocated(cfg)
    except PlacementError:  # reported by the placement rule
        return
    if cfg.runner.max_staleness > 0 and is_training(cfg) and collocated:
        yield ConfigIssue(
            KEY,
            f"{KEY}={cfg.runner.max_staleness} dispatches batches while the actor trains, but the "
            "actor and the rollout share their GPUs (collocated) and take turns: nothing can overlap.",
            f"set {KEY}=0, or place the actor and the rollout on disjoint GPUs (cluster.component_placement).",
        )


@rule(KEY, "runner.task_type", "rollout.return_logprobs")
def staleness_needs_engine_logprobs(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A batch sampled on older weights is corrected by pi_prox / pi_behav per token; pi_behav is the engine's
    log-probs of the sampled tokens."""
    if cfg.runner.max_staleness > 0 and is_training(cfg) and not cfg.rollout.return_logprobs:
        yield ConfigIssue(
            KEY,
            f"{KEY}={cfg.runner.max_staleness} trains on tokens sampled by older weights, whose "
            "behaviour log-probs come from the engine, but rollout.return_logprobs=false.",
            f"set rollout.return_logprobs=true, or {KEY}=0.",
        )


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
            weight,
            f"{KEY}={k} trains tokens sampled by weights up to {k} step(s) old, and {weight}=none leaves "
            "them uncorrected (no pi_prox / pi_behav weight): the gradient is biased by their staleness.",
            f"set {weight}=truncate (or mask), or {KEY}=0; keep none only to measure the uncorrected loss.",
            warning=True,
        )


@rule(KEY, "runner.task_type", "agentloop.agent")
def staleness_needs_aligned_logprobs(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Stale tokens are weighted by the engine's log-probs, so they must be the trained tokens' (the registry's
    ``AgentSpec.retokenizes``: MMSearch-R1's loop re-tokenises its responses, and that alignment is not tested)."""
    spec = agent_spec(cfg)
    if cfg.runner.max_staleness > 0 and is_training(cfg) and spec.retokenizes:
        yield ConfigIssue(
            KEY,
            f"{KEY}={cfg.runner.max_staleness} needs the engine's log-probs aligned with the trained "
            f"tokens; agent {spec.name} re-tokenises its responses and that alignment is not tested yet.",
            f"set {KEY}=0 for agentloop.agent={spec.name}.",
        )


PARTIAL = "runner.partial_rollout"


@rule(PARTIAL, KEY, "runner.task_type", ENGINE_KEY)
def partial_rollout_needs_batches_ahead(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """A sync cuts turns in flight only when batches are in flight during it (k >= 1), and only on an engine that
    stops them and goes on from their tokens so far (``EngineSpec.partial_rollout``)."""
    if not (cfg.runner.partial_rollout and is_training(cfg)):
        return
    if cfg.runner.max_staleness < 1:
        yield ConfigIssue(
            PARTIAL,
            f"{PARTIAL}=true at {KEY}={cfg.runner.max_staleness}: no turn is in flight when "
            "the weights sync (the synchronous order), so there is nothing to cut.",
            f"set {KEY}=1 or more, or {PARTIAL}=false.",
        )
    engine, able = engine_spec(cfg), engines_with("partial_rollout")
    if not engine.partial_rollout:  # SGLang's: not wired yet
        yield ConfigIssue(
            PARTIAL,
            f"{PARTIAL}=true with {ENGINE_KEY}={engine.name}: this engine's turns "
            "cannot be cut by a sync yet (only " + ", ".join(able) + "'s).",
            f"set {ENGINE_KEY}={able[0]}, or {PARTIAL}=false (the sync then waits for the turns).",
        )


SYNC_EVERY = "runner.sync_every"


@rule(SYNC_EVERY, KEY, "runner.admission")
def sync_every_fits_the_bound(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Batch s + k needs the weights of step s at the latest: a sync may be skipped while the engines' version stays
    within k of every step. Group admission's dispatch is not gated by the engines' version: refused."""
    n, k = cfg.runner.sync_every, cfg.runner.max_staleness
    if n < 1:
        yield ConfigIssue(
            SYNC_EVERY,
            f"{SYNC_EVERY}={n}: the weights must reach the engines.",
            f"set {SYNC_EVERY}=1 (every step) or more.",
        )
    elif n - 1 > k:
        yield ConfigIssue(
            SYNC_EVERY,
            f"{SYNC_EVERY}={n} with {KEY}={k}: batch s + {k + 1} would wait for weights "
            f"that are only sent {n} steps apart, past the staleness bound.",
            f"set {SYNC_EVERY} to 1..{k + 1}, or {KEY}={n - 1} or more.",
        )
    elif n > 1 and cfg.runner.admission == "group":
        yield ConfigIssue(
            SYNC_EVERY,
            f"{SYNC_EVERY}={n} with runner.admission=group: group admission dispatches "
            "without waiting for the engines' weights to be recent enough.",
            f"set runner.admission=batch, or {SYNC_EVERY}=1.",
        )


@rule("runner.in_flight_batches", KEY)
def in_flight_batches_fit_the_bound(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Group admission trains every group within k steps of its dispatch: more than k + 1 batches untrained at once
    could not all be trained in time."""
    n, k = cfg.runner.in_flight_batches, cfg.runner.max_staleness
    if n != -1 and not 1 <= n <= k + 1:
        yield ConfigIssue(
            "runner.in_flight_batches",
            f"runner.in_flight_batches={n} with {KEY}={k}: between 1 and "
            f"k + 1 = {k + 1} batches can be untrained at once and still be trained within k steps.",
            f"set runner.in_flight_batches to 1..{k + 1}, or -1 (k + 1).",
        )
