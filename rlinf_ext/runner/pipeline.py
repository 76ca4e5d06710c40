"""The batch pipeline: which prompts each step trains, and the agent-loop rollouts running ahead of the step.

``runner.max_staleness = k`` (not collocated: a config rule): batch b gets its own sub-queues
(``protocol/channels.py:batch_key``) and starts at step b - k after that step's sync, so up to k + 1 batches are in
flight. Seeds and uids follow the batch index: every k samples the same prompts with the same seeds (k = 0:
synchronous). Admission ``batch``: step b trains batch b (or ``runner/dynamic_sampling.py``'s selection); ``group``:
``runner/admission.py``; both hand over a ``RolledOutBatch`` (one head version per group). ``position()`` counts the
batches admitted (group admission: dispatched), never those read ahead, so a resume trains the uninterrupted run's
prompts; under group admission ``in_flight_prompts()`` names the untrained ones by (batch, slot), dispatched first
on resume (the step that trains each may differ). ``drain()`` cancels the batches in flight and discards them."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from rlinf_ext.protocol import channels as ch
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.runner.admission import GroupStream
from rlinf_ext.runner.data_order import BatchOrder
from rlinf_ext.runner.dynamic_sampling import Ready, kept_count, select_groups, share_unit
from rlinf_ext.runner.groups import WorkerGroups, abort_call, wait_or_raise
from rlinf_ext.workers.returns import AgentLoopOutput, FinishedGroup, RewardOutput

POLL_S = 0.05  # group admission: how often a wait for the next finished group looks for a failed rollout
DRAIN_TIMEOUT_S = 60.0  # how long a stop waits for each cancelled batch in flight to end
REFILL_SEED_STRIDE = 1_000_000_007  # a refill's request seed: the batch's + refill x this (far from any batch's seed)


def sync_due(step: int, engine_version: int, every: int, max_staleness: int) -> bool:
    """Whether step ``step`` syncs the weights (``runner.sync_every``, pure): every ``every``-th step, and whenever
    the engines' weights are more than k steps old, since batch ``step`` is dispatched only on version step - k or
    later (a resume starts on version 0)."""
    return step % every == 0 or step - engine_version > max_staleness


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
    untrained: set[str] = field(default_factory=set)  # group admission: its groups' uids no step trained yet

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


def read_in_thread(get: Any) -> futures.Future:
    """``get()`` in a daemon thread (a read still blocked when the run stops must not hold the process's exit)."""
    future: futures.Future = futures.Future()

    def run() -> None:
        try:
            future.set_result(get())
        except BaseException as exc:  # noqa: BLE001 - handed to the driver through the future
            future.set_exception(exc)

    threading.Thread(target=run, name="rlinf-ext-stream-read", daemon=True).start()
    return future


class BatchPipeline:
    """Dispatch, admission, weight versions and drain of the run's batches; the trainer asks for one
    ``RolledOutBatch`` per step (``next_batch``) after each weight sync (``synced``)."""

    def __init__(
        self,
        cfg: Any,
        groups: WorkerGroups,
        channels: dict[str, KeyedChannel],
        max_staleness: int,
        order: BatchOrder | None = None,
        dataset: Sequence = (),
        max_steps: int = 0,
    ):
        self.cfg, self.groups, self.channels = cfg, groups, channels
        self.max_staleness = max_staleness
        self.order, self.dataset, self.max_steps = order, dataset, max_steps
        self.dynamic_sampling = cfg.algorithm.adv_type == "grpo_dynamic"
        self.in_flight: deque[InFlight] = deque()  # dispatched, not admitted yet: consecutive batches in order
        self._batches: Iterator[tuple[list[dict], int]] | None = None  # the run's order from the position
        self._position = 0  # the data position after the last batch admitted to a step (or a resume's)
        self.engine_version = 0  # the weight version the rollout engines hold (global_step at the last sync)
        self.by_group = cfg.runner.admission == "group"
        # group admission's finished groups in arrival order (batch admission reads each batch's own sub-queue)
        self.stream = GroupStream(cfg.data.rollout_batch_size, max_staleness) if self.by_group else None
        self._carried: list[tuple[int, list[int]]] = []  # a resume's (batch, slots) in flight at its checkpoint
        self._pending_read: futures.Future | None = None  # group admission: the stream's blocking get

    # ------------------------------------------------------------------ position and versions
    def resume_at(self, position: int, in_flight: Sequence[Sequence[int]] = ()) -> None:
        """Resume at data position ``position`` with the checkpoint's prompts in flight ((batch, slot) pairs)."""
        if in_flight and not self.by_group:
            raise ValueError(
                f"the checkpoint holds {len(in_flight)} prompts in flight, written under "
                "runner.admission=group: batch admission cannot train them. Resume with "
                "runner.admission=group."
            )
        self._position = position
        slots: dict[int, list[int]] = {}
        for batch, slot in in_flight:
            slots.setdefault(int(batch), []).append(int(slot))
        self._carried = [(batch, sorted(slots[batch])) for batch in sorted(slots)]

    def start(self) -> None:
        """Read the run's order from the position on, to the last epoch's end."""
        if self.order is not None:
            self._batches = ((items, b + 1) for b, items in self.order.batches(self.dataset, self._position))

    def position(self) -> int:
        """The data position a checkpoint stores: batches read ahead are not counted (a resume reads them again)."""
        return self._position

    def in_flight_prompts(self) -> list[list[int]]:
        """Group admission: the (batch, slot) of every prompt dispatched and not trained yet, which a checkpoint
        stores beside the position (batch admission: none, the position says it)."""
        if not self.by_group:
            return []
        uids = self.stream.untrained() + [f"s{b}-{slot}-" for b, slots in self._carried for slot in slots]
        return sorted([int(label[1:]), int(slot)] for label, slot, _ in (uid.split("-", 2) for uid in uids))

    def synced(self, version: int) -> None:
        """The engines now hold weight version ``version``: batches dispatched from now on start there."""
        self.engine_version = version

    def exhausted(self) -> bool:
        """A dynamic-sampling run reads more than one batch per step, so its data can end before
        ``runner.max_steps``: nothing is in flight and the position is at the end of the last epoch."""
        return (
            self.dynamic_sampling
            and self.order is not None
            and not self.in_flight
            and self._position >= self.order.total_batches
        )

    def rollout_intervals(self, now: float) -> list[tuple[float, float]]:
        """The rollouts in flight (not admitted yet), for the step's rollout busy time."""
        return [flight.rollout_interval(now) for flight in self.in_flight]

    # ------------------------------------------------------------------ dispatch
    def _put_batch(
        self, items: list[dict], batch: int, requests: KeyedChannel, refill: int = 0, slots: Sequence[int] | None = None
    ) -> list[str]:
        """Batch ``batch``'s requests, one per agent-loop rank; the seed and the uids follow the batch index (and a
        dynamic-sampling step's refill number: ``s<batch>r<refill>-...``, so uids stay unique across refills) and
        the prompt's slot in its batch (``slots``: a resume's prompts of a batch in flight, else 0, 1, ...)."""
        parts = self.groups.placement.agent_loop_world_size
        seed = self.cfg.runner.seed * 1_000_003 + batch + refill * REFILL_SEED_STRIDE
        label = f"s{batch}" if refill == 0 else f"s{batch}r{refill}"
        uids = [f"{label}-{k:04d}-{it['uid']}" for k, it in zip(slots or range(len(items)), items)]
        for chunk, chunk_uids in zip(split_list(items, parts), split_list(uids, parts)):
            requests.put(
                AgentRolloutRequest(
                    n=self.cfg.algorithm.group_size,
                    input_ids=[it["prompt_ids"] for it in chunk],
                    image_data=[[] for _ in chunk],
                    answers=[it["answers"] for it in chunk],
                    multi_modal_inputs=[None for _ in chunk],
                    uids=chunk_uids,
                    seed=seed,
                    priority=batch,  # the oldest batch in flight is the one the next step waits for
                    tasks=[it["task"] for it in chunk if "task" in it],  # MMSearch-R1 questions with their images
                )
            )
        return uids

    def _start(
        self,
        items: list[dict],
        batches_read: int | None,
        batch: int,
        refill: int = 0,
        slots: Sequence[int] | None = None,
    ) -> InFlight:
        """Start the agent-loop rollout of one batch on its own DataLoader and Rollout sub-queues (group admission:
        on the Rollout stream all batches share)."""
        requests = self.channels[ch.DATALOADER].sub(ch.batch_key(batch, refill))
        results = self.channels[ch.ROLLOUT].sub(ch.STREAM if self.by_group else ch.batch_key(batch, refill))
        uids = self._put_batch(items, batch, requests, refill, slots)
        handle = self.groups.agent_loop.run_agentloop_rollout(requests, results)
        if self.by_group:
            self.stream.dispatched(uids, self.engine_version)
        return InFlight(
            batch,
            len(items),
            results,
            handle,
            self.engine_version,
            time.perf_counter(),
            batches_read,
            set(uids) if self.by_group else set(),
        )

    def _fill(self, step: int) -> None:
        """Dispatch the run's next batches up to ``step + k`` (never past the last step), and only those whose
        staleness the engines' weights keep within k (``runner.sync_every`` skips syncs)."""
        last = min(step, self.engine_version) + self.max_staleness
        last = min(last, self.max_steps - 1)
        while self._batches is not None and step + len(self.in_flight) <= last:
            following = next(self._batches, None)
            if following is None:
                break
            self.in_flight.append(self._start(*following, batch=step + len(self.in_flight)))

    def _fill_groups(self, step: int) -> None:
        """Group admission: a resume's prompts in flight first, then the run's next batches while at most
        ``runner.in_flight_batches`` (-1: k + 1) batches of groups stay untrained (and no more than the remaining
        steps train). A batch is labelled with its
        index in the run's order, so its seed and uids follow its prompts, not the step that trains them."""
        size = self.cfg.data.rollout_batch_size
        while self._carried:
            batch, slots = self._carried.pop(0)
            items = [self.dataset[i] for i in self.order.batch_indices(batch)]
            self.in_flight.append(self._start([items[k] for k in slots], None, batch, slots=slots))
        cap = self.cfg.runner.in_flight_batches
        room = min(self.max_staleness + 1 if cap == -1 else cap, self.max_steps - step) * size
        while self._batches is not None and len(self.stream.versions) + size <= room:
            following = next(self._batches, None)
            if following is None:
                break
            items, batches_read = following
            self.in_flight.append(self._start(items, batches_read, batch=batches_read - 1))
            self._position = batches_read

    def _read_finished(self) -> FinishedGroup:
        """The next finished group off the Rollout stream; a batch's failed rollout is raised meanwhile (its groups
        would never come). The driver's channel get has no completion test (RLinf's ``AsyncRayWork`` only waits),
        so the blocking get runs in a reader thread and the driver polls its future; a read still pending when a
        step ends is the next step's."""
        if self._pending_read is None:
            self._pending_read = read_in_thread(self.channels[ch.ROLLOUT].sub(ch.STREAM).get)
        while not futures.wait([self._pending_read], timeout=POLL_S).done:
            for flight in self.in_flight:
                if flight.handle.done():
                    wait_or_raise(flight.handle, "agent_loop", "run_agentloop_rollout")
        read, self._pending_read = self._pending_read, None
        return read.result()

    def _admit_groups(self, step: int) -> RolledOutBatch:
        """The groups ``runner/admission.py:admit`` picks for step ``step``, put on their own Rollout sub-queue for
        the reward call; a batch whose groups are all trained leaves the flight."""
        started = time.perf_counter()
        picked = self.stream.take(step, self._read_finished)
        results = self.channels[ch.ROLLOUT].sub(ch.admitted_key(step))
        outs, versions, first, ends = [], [], math.inf, []
        for group, version in picked:
            uid = group.result.uid
            flight = next(f for f in self.in_flight if uid in f.untrained)
            flight.untrained.discard(uid)
            results.put(group.result)
            outs.append(group.output)
            versions.append(version)
            first = min(first, flight.dispatched_at)
            ends.append(flight.dispatched_at + group.output.wall_time)
        for flight in [f for f in self.in_flight if not f.untrained]:  # every group arrived: the call has ended
            wait_or_raise(flight.handle, "agent_loop", "run_agentloop_rollout")
            self.in_flight.remove(flight)
        # one output of the step's groups; its wall time from the first dispatch to the last group's end
        merged = dataclasses.replace(AgentLoopOutput.merged(outs), wall_time=max(ends) - first)
        return RolledOutBatch(
            step, len(picked), results, Ready([merged]), versions, first, wait_s=time.perf_counter() - started
        )

    # ------------------------------------------------------------------ admission
    def next_batch(self, step: int, items: list[dict] | None = None) -> RolledOutBatch:
        """Dispatch the batches up to ``step + k`` not in flight yet (``items``: the one batch to dispatch, for a
        caller that feeds the batches itself, k = 0), then admit batch ``step`` (group admission: the groups
        ``runner/admission.py`` picks)."""
        if items is not None:
            if self.in_flight:
                raise RuntimeError(
                    f"train_step(items) with {len(self.in_flight)} batch(es) in flight: batches "
                    "dispatched ahead come from the run's data order (run())."
                )
            self.in_flight.append(self._start(items, None, step))
        elif self.by_group:
            self._fill_groups(step)
        else:
            self._fill(step)
        if self.by_group:
            return self._admit_groups(step)
        if not self.in_flight or self.in_flight[0].batch != step:
            raise RuntimeError(f"step {step} has no batch in flight: the data order ran out early.")
        flight = self.in_flight.popleft()
        if self.dynamic_sampling:
            admitted, position = self._sample_dynamic(flight, step)
        else:
            admitted = RolledOutBatch(
                flight.batch,
                flight.groups,
                flight.results,
                flight.handle,
                [flight.version] * flight.groups,
                flight.dispatched_at,
            )
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
            flight.batch,
            trained,
            flight.results,
            rollout=Ready([AgentLoopOutput.merged(rank) for rank in zip(*agent_outs)]),
            head_versions=[flight.version] * trained,
            dispatched_at=flight.dispatched_at,
            scored=Ready([RewardOutput.merged(reward_outs)]),
            metrics=selection.metrics(gen_batches=len(batches)),
            wait_s=time.perf_counter() - started,
        )
        return admitted, current.batches_read

    # ------------------------------------------------------------------ the end
    def drain(self) -> list[tuple[int, BaseException | None]]:
        """Abort the batches in flight and discard them (a stop after a step; a resume rolls them out again): their
        agent loops are cancelled at the turn in progress rather than waited for, and how each ended is returned,
        ``(batch, error or None)``, never raised."""
        ended = []
        while self.in_flight:
            flight = self.in_flight.popleft()
            ended.append(
                (flight.batch, abort_call(flight.handle, "agent_loop", "run_agentloop_rollout", DRAIN_TIMEOUT_S))
            )
        if self.stream is not None:
            self.stream.clear()
        return ended

    def forget(self) -> None:
        """Drop the batches in flight without waiting (their agent loops end with the worker groups)."""
        self.in_flight.clear()
        if self.stream is not None:
            self.stream.clear()
