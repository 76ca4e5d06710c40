"""The batch pipeline: which prompts each step trains, and the agent-loop rollouts running ahead of the step.

Batches are dispatched ahead (``runner.max_staleness = k``; CPU and disaggregated placements only, a config rule):
batch b goes on DataLoader and Rollout sub-queues of its own (``protocol/channels.py:batch_key``) and its rollout
starts at step b - k, right after that step's weight sync, so up to k + 1 batches are in flight and every group's
head staleness is min(b, k) (fewer after a resume: the pipeline refills at the resumed version). The syncs land
while later batches are mid-trajectory (the engines take the weights between turns). The request seed and the uids
follow the batch index, so a batch samples the same prompts with the same seeds whatever k is; k = 0 is the
synchronous order.

Admission is by batch: step b trains exactly batch b, or, under dynamic sampling (``runner/dynamic_sampling.py``),
the groups selected from batch b and the refills it read. What the trainer gets is a ``RolledOutBatch``: a count of
groups, where they wait, the agent-loop returns and one head version per group, so an admission that takes groups
from several batches can hand over the same thing.

The order of batches is a pure function of the data position (``runner/data_order.py``); ``position()`` counts the
batches admitted to a step, never those read ahead, and the trainer checkpoints only after a step trained its
batch, so a resume trains exactly what the uninterrupted run trains. ``drain()`` cancels the batches in flight and
discards them (a stop; a resume rolls them out again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf_ext.protocol import channels as ch
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.runner.data_order import BatchOrder
from rlinf_ext.runner.dynamic_sampling import Ready, kept_count, select_groups, share_unit
from rlinf_ext.runner.groups import WorkerGroups, abort_call, wait_or_raise
from rlinf_ext.workers.returns import AgentLoopOutput, RewardOutput

DRAIN_TIMEOUT_S = 60.0  # how long a stop waits for each cancelled batch in flight to end
REFILL_SEED_STRIDE = 1_000_000_007  # a refill's request seed: the batch's + refill x this (far from any batch's seed)


def split_list(items: list, parts: int) -> list[list]:
    """Contiguous chunks whose sizes differ by at most one (RLinf's ``split_list``)."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


@dataclass
class InFlight:
    """A batch whose agent-loop rollout was started and that no step has trained yet."""

    batch: int  # its index = the step that trains it
    groups: int  # prompt groups: results that arrive on ``results``
    results: KeyedChannel  # its Rollout sub-queue
    handle: Any  # the agent loop's run_agentloop_rollout call
    version: int  # the engines' weight version when it was dispatched
    dispatched_at: float  # time.perf_counter()
    batches_read: int | None  # the data position just after this batch (None: not read from the run's order)

    def rollout_interval(self, now: float) -> tuple[float, float]:
        """(start, end) of its rollout as seen from the driver: the end is known once the call has returned."""
        if not self.handle.done():
            return self.dispatched_at, now
        outs: list[AgentLoopOutput] = self.handle.wait()
        return self.dispatched_at, self.dispatched_at + max(out.wall_time for out in outs)


@dataclass
class RolledOutBatch:
    """What one step trains: ``num_results`` groups, unscored on ``results`` or, when admission scored them
    (``scored``), already on the Reward queue."""

    batch: int  # the step that trains it
    num_results: int  # groups the actor's log-prob recompute and update take
    results: KeyedChannel
    rollout: Any  # the agent-loop call (or its ``Ready`` returns): wait() -> one AgentLoopOutput per rank
    head_versions: list[int]  # per group: the engines' weight version when its rollout started
    dispatched_at: float  # time.perf_counter() when its rollout started
    scored: Ready | None = None  # [RewardOutput] of the groups admission scored
    metrics: dict[str, float] = field(default_factory=dict)  # the admission's own (dynamic/...)
    wait_s: float = 0.0  # the driver's wait for rollouts and rewards during admission (time/wait_rollout)

    def score(self, reward_group: Any, scored: KeyedChannel, step: int) -> Any:
        """The reward call of its groups (wait() -> [RewardOutput]): admission's, else one from ``results`` that
        puts the scored groups on ``scored``."""
        if self.scored is not None:
            return self.scored
        return reward_group.compute_rewards(self.results, scored, self.num_results, step)


class BatchPipeline:
    """Dispatch, admission, weight versions and drain of the run's batches; the trainer asks for one
    ``RolledOutBatch`` per step (``next_batch``) after each weight sync (``synced``)."""

    def __init__(self, cfg: Any, groups: WorkerGroups, channels: dict[str, KeyedChannel], max_staleness: int,
                 order: BatchOrder | None = None, dataset: Sequence = (), max_steps: int = 0):
        self.cfg, self.groups, self.channels = cfg, groups, channels
        self.max_staleness = max_staleness
        self.order, self.dataset, self.max_steps = order, dataset, max_steps
        self.dynamic_sampling = cfg.algorithm.adv_type == "grpo_dynamic"
        self.in_flight: deque[InFlight] = deque()  # dispatched, not admitted yet: consecutive batches in order
        self._batches: Iterator[tuple[list[dict], int]] | None = None  # the run's order from the position
        self._position = 0  # the data position after the last batch admitted to a step (or a resume's)
        self.engine_version = 0  # the weight version the rollout engines hold (global_step at the last sync)

    # ------------------------------------------------------------------ position and versions
    def resume_at(self, position: int) -> None:
        self._position = position

    def start(self) -> None:
        """Read the run's order from the position on, to the last epoch's end."""
        if self.order is not None:
            self._batches = ((items, b + 1) for b, items in self.order.batches(self.dataset, self._position))

    def position(self) -> int:
        """The data position a checkpoint stores: batches read ahead are not counted (a resume reads them again)."""
        return self._position

    def synced(self, version: int) -> None:
        """The engines now hold weight version ``version``: batches dispatched from now on start there."""
        self.engine_version = version

    def exhausted(self) -> bool:
        """A dynamic-sampling run reads more than one batch per step, so its data can end before
        ``runner.max_steps``: nothing is in flight and the position is at the end of the last epoch."""
        return (self.dynamic_sampling and self.order is not None and not self.in_flight
                and self._position >= self.order.total_batches)

    def rollout_intervals(self, now: float) -> list[tuple[float, float]]:
        """The rollouts in flight (not admitted yet), for the step's rollout busy time."""
        return [flight.rollout_interval(now) for flight in self.in_flight]

    # ------------------------------------------------------------------ dispatch
    def _put_batch(self, items: list[dict], batch: int, requests: KeyedChannel, refill: int = 0) -> None:
        """Batch ``batch``'s requests, one per agent-loop rank; the seed and the uids follow the batch index (and a
        dynamic-sampling step's refill number: ``s<batch>r<refill>-...``, so uids stay unique across refills)."""
        parts = self.groups.placement.agent_loop_world_size
        seed = self.cfg.runner.seed * 1_000_003 + batch + refill * REFILL_SEED_STRIDE
        label = f"s{batch}" if refill == 0 else f"s{batch}r{refill}"
        uids = [f"{label}-{k:04d}-{it['uid']}" for k, it in enumerate(items)]
        for chunk, chunk_uids in zip(split_list(items, parts), split_list(uids, parts)):
            requests.put(AgentRolloutRequest(
                n=self.cfg.algorithm.group_size,
                input_ids=[it["prompt_ids"] for it in chunk],
                image_data=[[] for _ in chunk],
                answers=[it["answers"] for it in chunk],
                multi_modal_inputs=[None for _ in chunk],
                uids=chunk_uids,
                seed=seed,
                tasks=[it["task"] for it in chunk if "task" in it],  # MMSearch-R1 questions with their images
            ))

    def _start(self, items: list[dict], batches_read: int | None, batch: int, refill: int = 0) -> InFlight:
        """Start the agent-loop rollout of one batch on its own DataLoader and Rollout sub-queues."""
        requests = self.channels[ch.DATALOADER].sub(ch.batch_key(batch, refill))
        results = self.channels[ch.ROLLOUT].sub(ch.batch_key(batch, refill))
        self._put_batch(items, batch, requests, refill)
        handle = self.groups.agent_loop.run_agentloop_rollout(requests, results)
        return InFlight(batch, len(items), results, handle, self.engine_version, time.perf_counter(), batches_read)

    def _fill(self, step: int) -> None:
        """Dispatch the run's next batches up to ``step + k`` (never past the last step)."""
        last = min(step + self.max_staleness, self.max_steps - 1)
        while self._batches is not None and step + len(self.in_flight) <= last:
            following = next(self._batches, None)
            if following is None:
                break
            self.in_flight.append(self._start(*following, batch=step + len(self.in_flight)))

    # ------------------------------------------------------------------ admission
    def next_batch(self, step: int, items: list[dict] | None = None) -> RolledOutBatch:
        """Dispatch the batches up to ``step + k`` not in flight yet (``items``: the one batch to dispatch, for a
        caller that feeds the batches itself, k = 0), then admit batch ``step``."""
        if items is not None:
            if self.in_flight:
                raise RuntimeError(f"train_step(items) with {len(self.in_flight)} batch(es) in flight: batches "
                                   "dispatched ahead come from the run's data order (run()).")
            self.in_flight.append(self._start(items, None, step))
        else:
            self._fill(step)
        if not self.in_flight or self.in_flight[0].batch != step:
            raise RuntimeError(f"step {step} has no batch in flight: the data order ran out early.")
        flight = self.in_flight.popleft()
        if self.dynamic_sampling:
            admitted, position = self._sample_dynamic(flight, step)
        else:
            admitted = RolledOutBatch(flight.batch, flight.groups, flight.results, flight.handle,
                                      [flight.version] * flight.groups, flight.dispatched_at)
            position = flight.batches_read
        if position is not None:
            self._position = position
        return admitted

    def _sample_dynamic(self, flight: InFlight, step: int) -> tuple[RolledOutBatch, int | None]:
        """Score batch ``flight`` and, while fewer than ``data.rollout_batch_size`` of the scored groups have mixed
        rewards, roll out and score the run's next batch, up to ``algorithm.max_num_gen_batches`` batches (or the
        end of the run's data; ``train_step(items)`` has none to read). The selection (``select_groups``) waits on
        the Reward queue for the log-prob recompute; the rest is discarded. Returns it with the data position after
        the refills, so a checkpoint after this step resumes after them. Runs before a collocated step hands the GPU
        to the actor: the refills need the engine."""
        g, q, alg = self.groups, self.channels, self.cfg.algorithm
        started = time.perf_counter()
        held = q[ch.REWARD].sub(ch.HELD)
        batches, agent_outs, reward_outs = [], [], []
        current = flight
        while True:
            scored = g.reward.compute_rewards(current.results, held, current.groups, step)
            agent_outs.append(wait_or_raise(current.handle, "agent_loop", "run_agentloop_rollout"))
            reward_outs.append(wait_or_raise(scored, "reward", "compute_rewards")[0])
            # arrival order varies; the uids (s<batch>[r<refill>]-<k>-...) sort in dispatch order within a batch
            batches.append(sorted((held.get() for _ in range(current.groups)), key=lambda r: r.uid))
            if kept_count(batches) >= self.cfg.data.rollout_batch_size or len(batches) >= alg.max_num_gen_batches:
                break
            following = next(self._batches, None) if self._batches is not None else None
            if following is None:
                break
            current = self._start(*following, batch=flight.batch, refill=len(batches))
        unit = share_unit(g.placement.actor_world_size, alg.group_size, alg.n_minibatches)
        selection = select_groups(batches, self.cfg.data.rollout_batch_size, unit)
        for result in selection.trained:
            q[ch.REWARD].put(result)
        trained = len(selection.trained)
        admitted = RolledOutBatch(
            flight.batch, trained, flight.results,
            rollout=Ready([AgentLoopOutput.merged(rank) for rank in zip(*agent_outs)]),
            head_versions=[flight.version] * trained, dispatched_at=flight.dispatched_at,
            scored=Ready([RewardOutput.merged(reward_outs)]), metrics=selection.metrics(gen_batches=len(batches)),
            wait_s=time.perf_counter() - started)
        return admitted, current.batches_read

    # ------------------------------------------------------------------ the end
    def drain(self) -> list[tuple[int, BaseException | None]]:
        """Abort the batches in flight and discard them (a stop after a step; a resume rolls them out again): their
        agent loops are cancelled at the turn in progress rather than waited for, and how each ended is returned,
        ``(batch, error or None)``, never raised."""
        ended = []
        while self.in_flight:
            flight = self.in_flight.popleft()
            ended.append((flight.batch, abort_call(flight.handle, "agent_loop", "run_agentloop_rollout",
                                                   DRAIN_TIMEOUT_S)))
        return ended

    def forget(self) -> None:
        """Drop the batches in flight without waiting (their agent loops end with the worker groups)."""
        self.in_flight.clear()
