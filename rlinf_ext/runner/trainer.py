"""The GRPO runner on RLinf's scheduler, for both agents (Search-R1 text, MMSearch-R1 vision-language).

It follows RLinf's ``AgentRunner`` step by step — put the batch on the ``DataLoader`` channel, sync weights
actor -> rollout, agent-loop rollout (generation through the rollout group, search through the search tool),
rewards, recompute old/reference log-probs, train, checkpoint — but is our own code, because RLinf 0.3.0's
``rlinf.runners.agent_runner`` imports Megatron-LM's ``megatron.training`` package at load time, which is not on
PyPI (only megatron-core is). Worker method names and channel payloads are RLinf's, so the same runner drives the
CPU workers and RLinf-derived GPU workers.

Validation during training (``rlinf_ext.eval.core.validation``; the agent's pass is the registry's ``validation``:
Search-R1's per benchmark, MMSearch-R1's per FVQA category): before the first step (``runner.val_before_train``)
and after every ``runner.val_check_interval`` steps, the actor's weights are synced to the rollout group and a
greedy pass over a fixed subset runs from the driver through the rollout group; its ``val/...`` metrics join
that step's metrics (step 0: an ``on_step(0, metrics, [])`` call of its own).

Collocated GPU runs (actor and rollout on the same GPUs, ``config/placement.py:is_collocated``) follow
RLinf's non-pipelined order so the two never hold the GPU at once: the rollout initialises (and releases its
memory) before the actor does, and the actor offloads after start-up; each step waits for the whole rollout,
offloads the rollout engine, onloads the actor, then computes rewards, log-probs and the update, and
offloads the actor again. CPU and disaggregated runs keep the overlapped order.

Batches dispatched ahead (``runner.max_staleness = k``, CPU and disaggregated placements only: config rule): batch b
is put on DataLoader and Rollout sub-queues of its own (``protocol/channels.py:batch_key``) and its agent-loop
rollout starts at step b - k, right after that step's weight sync; step b trains exactly batch b, so up to k + 1
batches are in flight and every group's head staleness is min(b, k) (fewer after a resume: the pipeline refills
at the resumed version). The sync after each step lands while the later batches are mid-trajectory (the engines
take the weights between turns). The request seed and the uids follow the batch index b, so a batch samples the
same prompts with the same seeds whatever k is. The batches' order is a pure function of the position
(``runner/data_order.py``: a new permutation each epoch), and a checkpoint stores the position after the last
*trained* batch, not the read-ahead position, so a resume trains exactly what the uninterrupted run trains. A stop
(SIGTERM) finishes the step, checkpoints, then cancels the batches in flight and discards them, whatever they end
with (the engines keep serving until ``shutdown()``). k = 0 is the synchronous order.
"""

from __future__ import annotations

import math
import time
import uuid
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from rlinf.scheduler import Channel
from tqdm import tqdm

from rlinf_ext.config.placement import is_collocated
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.eval.core.validation import should_validate
from rlinf_ext.protocol import channels as ch
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.protocol.generation import STOP_SERVING, GenerateRequest
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.runner.data_order import batch_order, load_position, save_position
from rlinf_ext.runner.dynamic_sampling import (DynamicStep, Ready, kept_count, merge_agent_outputs,
                                               merge_reward_outputs, select_groups, share_unit)
from rlinf_ext.runner.checkpoints import check_complete, finalize, latest_complete_checkpoint, staging_dir, step_of
from rlinf_ext.runner.groups import WorkerGroups, abort_call, is_cancellation, wait_all_or_raise, wait_or_raise
from rlinf_ext.runner.metrics import engine_mismatch_step
from rlinf_ext.runner.staleness import busy_seconds, head_staleness_metrics, idle_ratios, token_staleness_metrics
from rlinf_ext.workers.agent_loop import ChannelGenerator

StepCallback = Callable[[int, dict, list], None]
VALIDATION_DIR = "validation"  # <run_dir>/validation/global_step_<N>/generations.jsonl
DRAIN_TIMEOUT_S = 60.0  # how long a stop waits for each cancelled batch in flight to end
RECORD_VERSIONS = "versions"  # a trajectory record's per-token weight versions (-1 on observation tokens), if any
REFILL_SEED_STRIDE = 1_000_000_007  # a refill's request seed: the batch's + refill x this (far from any batch's seed)


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
        return self.dispatched_at, self.dispatched_at + max(out["wall_time"] for out in self.handle.wait())


def validation_enabled(cfg: ExperimentConfig) -> bool:
    """Whether any step of this run can validate (``rlinf_ext.eval.core.validation.should_validate`` is true
    for some step): ``runner.val_before_train`` or ``runner.val_check_interval > 0``, with ``data.val_data_paths`` set."""
    runner = cfg.runner
    wanted = runner.val_before_train or runner.val_check_interval > 0
    return wanted and bool(cfg.data.val_data_paths)


def validation_pass_class(cfg: ExperimentConfig) -> type:
    """The agent's validation pass (``protocol/agents.py``: ``validation``)."""
    return agent_spec(cfg).load("validation")


def part_metrics(rank_results: list, prefix: str) -> dict[str, float]:
    """``<prefix>/<part>`` metrics from the rollout ranks' returns of a timed call (pure): each rank may return a
    dict of parts in seconds (the vLLM worker does for ``init_worker``, under ``time/rollout_start``, and
    ``sync_model_from_actor``, under ``time/sync``; the HF one returns None); max over ranks."""
    out: dict[str, float] = {}
    for parts in rank_results or ():
        for name, seconds in (parts or {}).items():
            key = mk.prefixed(prefix, name)
            out[key] = max(out.get(key, 0.0), float(seconds))
    return out


def split_list(items: list, parts: int) -> list[list]:
    """Contiguous chunks whose sizes differ by at most one (RLinf's ``split_list``)."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


def engine_counts_mismatches(cfg: ExperimentConfig) -> bool:
    """Whether the rollout engine counts prompts it expanded differently from the agent loop's ids: vLLM and
    SGLang with images (they expand each image's pads themselves; the HF engine takes the ids as they are)."""
    return cfg.rollout.model.model_type == "qwen2.5_vl" and cfg.rollout.rollout_backend != "hf"


def critic_step_metrics(training: list[dict]) -> dict[str, float]:
    """PPO: the critic's ``critic/...`` metrics of the step (the mean over its mini-batches; absent without a critic)."""
    keys = sorted({key for m in training for key in m if key.startswith(mk.CRITIC_PREFIX + "/")})
    return {key: float(sum(m[key] for m in training) / len(training)) for key in keys}


# --------------------------------------------------------------------------------------------- runner
class GRPOTrainer:
    reads_engine_state = False  # __init__: engine_counts_mismatches(cfg); fakes built without __init__ keep False

    def __init__(self, cfg: ExperimentConfig, groups: WorkerGroups, train_dataset, val_dataset=None,
                 on_step: StepCallback | None = None, verify_sync: bool = True,
                 should_stop: Callable[[], bool] | None = None):
        self.cfg = cfg
        self.groups = groups
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self.on_step = on_step
        self.verify_sync = verify_sync
        # asked after every step (SIGTERM: runner/services.py StopRequest): checkpoint, then return early
        self.should_stop = should_stop or (lambda: False)
        self.stopped_early = False
        self.global_step = 0
        self.reset_pipeline(cfg.runner.max_staleness)
        self.history: list[dict[str, float]] = []
        batch = cfg.data.rollout_batch_size
        if len(train_dataset) < batch:
            raise ValueError(f"data.rollout_batch_size={batch} is larger than the training set ({len(train_dataset)} prompts).")
        self.train_dataset = train_dataset
        self.order = batch_order(cfg, len(train_dataset))
        self.batches_read = 0  # the data position the pipeline reads from (a resume's; batches read ahead excluded)
        self.max_steps = self.total_steps(cfg, len(train_dataset))
        self.run_dir = Path(cfg.runner.output_dir) / cfg.runner.experiment_name
        self.ckpt_root = self.run_dir / "checkpoints"
        # One channel process, one named queue per stage (RLinf's channel names).
        self._channel = Channel.create(f"SearchR1-{cfg.runner.experiment_name}-{uuid.uuid4().hex[:8]}")
        self.channels = {name: KeyedChannel(self._channel, name) for name in ch.STEP_CHANNELS}
        self.resume_dir: Path | None = None
        self._serving = None
        self._validation = None  # ValidationPass, built on first use (see validation_pass)
        self.val_history: dict[int, dict[str, float]] = {}  # step -> val/... metrics of that pass
        self._rollout_current = False  # the rollout engine holds the actor's current weights
        self._sync_parts: dict[str, float] = {}  # the last sync's rollout-side parts (time/sync/<part>)
        self._launch_metrics: dict[str, float] = {}  # logged once, in this launch's first row
        self.reads_engine_state = engine_counts_mismatches(cfg)
        self._engine_counts = (0, 0)  # the rollout engines' (mismatches, prompts) already attributed to a step

    def reset_pipeline(self, max_staleness: int) -> None:
        """No batch in flight; batches will be dispatched ``max_staleness`` steps ahead of the step that trains them."""
        self.max_staleness = max_staleness
        self.in_flight: deque[InFlight] = deque()  # dispatched, not trained yet: batches global_step, ... in order
        self._batches: Iterator[tuple[list[dict], int]] | None = None  # the run's order from the position (run())
        self._trained_position: int | None = None  # the data position after the last trained batch
        self._engine_version = 0  # the weight version the rollout engines hold (global_step at the last sync)

    @staticmethod
    def total_steps(cfg: ExperimentConfig, dataset_len: int) -> int:
        """The batches of ``runner.max_epochs`` epochs capped by ``runner.max_steps`` (RLinf's ``_set_max_steps``)."""
        steps = batch_order(cfg, dataset_len).total_batches
        if cfg.runner.max_steps >= 0:
            steps = min(steps, cfg.runner.max_steps)
        return steps

    @property
    def generate_channels(self):
        return self.channels[ch.GENERATE_INPUT], self.channels[ch.GENERATE_OUTPUT]

    # ------------------------------------------------------------------ start-up
    def _resolve_resume_dir(self) -> Path | None:
        resume = self.cfg.runner.resume_dir
        if resume is None:
            return None
        if resume == "auto":
            return latest_complete_checkpoint(self.ckpt_root)
        path = Path(resume)
        reason = check_complete(path)
        if reason is not None:
            raise ValueError(f"runner.resume_dir={path} is not a complete checkpoint: {reason}. "
                             "Pass another global_step_N directory, 'auto', or null.")
        return path

    @cached_property
    def collocated_gpu(self) -> bool:
        """Actor and rollout share GPUs: they take turns (offload/onload) instead of overlapping."""
        return is_collocated(self.cfg)

    def init_workers(self) -> None:
        g = self.groups
        gen_in, gen_out = self.generate_channels
        handles = [
            ("rollout", "init_worker", g.rollout.init_worker()),
            ("reward", "init_worker", g.reward.init_worker()),
            ("agent_loop", "init_worker", g.agent_loop.init_worker(gen_in, gen_out)),
        ]
        rollout_init = handles[0][2]
        results = {}
        if self.collocated_gpu:  # the rollout releases its GPU memory at the end of its init: wait for it
            results["rollout"] = wait_or_raise(handles.pop(0)[2], "rollout", "init_worker", startup=True)
        handles.append(("actor", "init_worker", g.actor.init_worker()))
        for component, method, handle in handles:
            results[component] = wait_or_raise(handle, component, method, startup=True)
        self._launch_metrics = {mk.TIME_ROLLOUT_START: float(rollout_init.consume_duration()),
                                **part_metrics(results["rollout"], mk.TIME_ROLLOUT_START)}
        routes = g.placement.weight_sync
        wait_or_raise(g.actor.set_weight_sync(routes), "actor", "set_weight_sync")
        wait_or_raise(g.rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
        self.resume_dir = self._resolve_resume_dir()
        if self.resume_dir is not None:
            self.global_step = step_of(self.resume_dir)
            wait_or_raise(g.actor.load_checkpoint(str(self.resume_dir / "actor")), "actor", "load_checkpoint")
            data_state = self.resume_dir / "data" / "data.pt"
            self.batches_read = (load_position(self.order, data_state, self.global_step) if data_state.is_file()
                                 else self.global_step)
            print(f"[rlinf_ext] resumed from {self.resume_dir} (step {self.global_step})", flush=True)
        if self.collocated_gpu:  # the rollout gets the GPU first (weight sync, validation, generation)
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        # Never awaited, like RLinf: the rollout group serves generate requests until shutdown().
        self._serving = g.rollout.rollout_serverless(gen_in, gen_out)
        # Built now (not at the first validation step) so a bad val file fails at start-up, not hours in.
        self.validation_pass()

    # ------------------------------------------------------------------ one step
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

    def _sync_weights(self) -> bool:
        """Actor -> rollout weight sync (both sides at once: a failure on either is raised, not waited on); skipped
        when the engine already holds the actor's current weights (validation synced them after the last
        update and nothing dropped them since)."""
        if self._rollout_current:
            return False
        g = self.groups
        version = {"version": self.global_step}
        _, received = wait_all_or_raise([
            (g.actor.sync_model_to_rollout(self.verify_sync), "actor", "sync_model_to_rollout"),
            (g.rollout.sync_model_from_actor(**version), "rollout", "sync_model_from_actor")])
        self._sync_parts = part_metrics(received, mk.TIME_SYNC)
        self._rollout_current = True
        self._engine_version = self.global_step
        return True

    def _offload_rollout(self) -> None:
        wait_or_raise(self.groups.rollout.offload_engine(), "rollout", "offload_engine")
        if self.collocated_gpu:  # SGLang's memory saver keeps no copy: the weights are gone until the next sync
            self._rollout_current = False

    # ------------------------------------------------------------------ batches in flight
    def _order_batches(self) -> Iterator[tuple[list[dict], int]]:
        """The batches from the data position on, to the last epoch's end, each with the position just after it
        (what a checkpoint after training it stores)."""
        for batch, items in self.order.batches(self.train_dataset, self.batches_read):
            yield items, batch + 1

    def _dispatch(self, items: list[dict], batches_read: int | None) -> None:
        """Start the agent-loop rollout of the next batch on its own DataLoader and Rollout sub-queues."""
        self.in_flight.append(self._start(items, batches_read, self.global_step + len(self.in_flight)))

    def _start(self, items: list[dict], batches_read: int | None, batch: int, refill: int = 0) -> InFlight:
        requests = self.channels[ch.DATALOADER].sub(ch.batch_key(batch, refill))
        results = self.channels[ch.ROLLOUT].sub(ch.batch_key(batch, refill))
        self._put_batch(items, batch, requests, refill)
        handle = self.groups.agent_loop.run_agentloop_rollout(requests, results)
        return InFlight(batch, len(items), results, handle, self._engine_version, time.perf_counter(), batches_read)

    def _fill(self) -> None:
        """Dispatch the run's next batches up to ``global_step + k`` (never past the last step)."""
        last = min(self.global_step + self.max_staleness, self.max_steps - 1)
        while self._batches is not None and self.global_step + len(self.in_flight) <= last:
            following = next(self._batches, None)
            if following is None:
                break
            self._dispatch(*following)

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

    # ------------------------------------------------------------------ one step
    def train_step(self, items: list[dict] | None = None) -> tuple[dict[str, float], list[dict]]:
        """Train batch ``global_step``: sync the weights, dispatch the batches up to ``global_step + k`` not in
        flight yet (``items``: the one batch to dispatch, for a caller that feeds the batches itself, k = 0),
        then reward, log-probs and the update of batch ``global_step``."""
        g, q = self.groups, self.channels
        started = time.perf_counter()
        t = time.perf_counter()
        synced = self._sync_weights()
        time_sync = time.perf_counter() - t
        if items is not None:
            if self.in_flight:
                raise RuntimeError(f"train_step(items) with {len(self.in_flight)} batch(es) in flight: batches "
                                   "dispatched ahead come from the run's data order (run()).")
            self._dispatch(items, None)
        else:
            self._fill()
        if not self.in_flight or self.in_flight[0].batch != self.global_step:
            raise RuntimeError(f"step {self.global_step} has no batch in flight: the data order ran out early.")
        flight = self.in_flight.popleft()
        dynamic = self._sample_dynamic(flight) if self.dynamic_sampling else None
        num_results = dynamic.num_results if dynamic else flight.groups
        rollout_h = dynamic.rollout if dynamic else flight.handle

        collocated = self.collocated_gpu
        wait_rollout = dynamic.wait_s if dynamic else 0.0
        if collocated:  # RLinf's non-pipelined order: the whole rollout, then the engine gives the GPU back
            t = time.perf_counter()
            agent_out = wait_or_raise(rollout_h, "agent_loop", "run_agentloop_rollout")
            wait_rollout += time.perf_counter() - t
            self._offload_rollout()
            wait_or_raise(g.actor.onload_engine(), "actor", "onload_engine")
        reward_h = dynamic.reward if dynamic else g.reward.compute_rewards(flight.results, q[ch.REWARD], num_results,
                                                                             self.global_step)
        kl = self.cfg.algorithm.kl_beta > 0
        infer_h = g.actor.run_inference(q[ch.REWARD], q[ch.INFERENCE], kl, num_results)
        train_h = g.actor.run_training(q[ch.INFERENCE], num_results, self.global_step)

        if not collocated:
            t = time.perf_counter()
            agent_out = wait_or_raise(rollout_h, "agent_loop", "run_agentloop_rollout")
            wait_rollout += time.perf_counter() - t
        # the agent loop's own clock: RLinf's per-method timer sums the overlapping calls of batches in flight
        time_rollout = max(out["wall_time"] for out in agent_out)
        reward_out = wait_or_raise(reward_h, "reward", "compute_rewards")[0]
        wait_or_raise(infer_h, "actor", "run_inference")
        time_recompute = infer_h.consume_duration()
        rollout_metrics, training = wait_or_raise(train_h, "actor", "run_training")[0]
        self._rollout_current = False  # the actor's weights changed
        time_train = train_h.consume_duration()
        if collocated:  # the next step starts with the weight sync into the rollout engine
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        else:
            self._offload_rollout()
        self.global_step += 1
        if flight.batches_read is not None:
            self._trained_position = flight.batches_read

        trajectories = [rec for out in agent_out for rec in out["trajectories"]]
        for rec in trajectories:
            rec["reward"] = reward_out["rewards"][rec["uid"]][rec["index"]]
            rec["step"] = self.global_step
        metrics = self._step_metrics(agent_out, reward_out["metrics"], rollout_metrics, training)
        tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in trajectories)
        ended = time.perf_counter()
        step_time = ended - started
        rollouts = [(flight.dispatched_at, flight.dispatched_at + time_rollout)]
        busy = busy_seconds(rollouts + [f.rollout_interval(ended) for f in self.in_flight], started, ended)
        metrics.update(head_staleness_metrics(flight.batch, [flight.version] * num_results))
        metrics.update(token_staleness_metrics(flight.batch, (rec.get(RECORD_VERSIONS) for rec in trajectories),
                                               self.max_staleness))
        metrics.update(idle_ratios(step_time, wait_rollout, busy))
        metrics.update({
            mk.TIME_ROLLOUT: float(time_rollout),
            mk.TIME_WAIT_ROLLOUT: wait_rollout,
            mk.TIME_TOOL: max(out["tool_time"] for out in agent_out),
            mk.TIME_RECOMPUTE: float(time_recompute),
            mk.TIME_TRAIN: float(time_train),
            mk.TIME_STEP: step_time,
            mk.THROUGHPUT_TOKENS_PER_S: tokens / max(step_time, 1e-9),
        })
        if dynamic:
            metrics.update(dynamic.metrics)
        if synced:  # a skipped sync is no 0-second sync: it would pull the mean sync time down
            metrics[mk.TIME_SYNC] = time_sync
            metrics.update(self._sync_parts)
        if self.reads_engine_state:
            metrics.update(self._engine_metrics(synced))
        return metrics, trajectories

    # ------------------------------------------------------------------ dynamic sampling
    @cached_property
    def dynamic_sampling(self) -> bool:
        """``algorithm.adv_type: grpo_dynamic``: all-equal groups are dropped and batches refilled
        (``runner/dynamic_sampling.py``)."""
        return self.cfg.algorithm.adv_type == "grpo_dynamic"

    def _sample_dynamic(self, flight: InFlight) -> DynamicStep:
        """Score batch ``flight`` and, while fewer than ``data.rollout_batch_size`` of the scored groups have mixed
        rewards, roll out and score the run's next batch, up to ``algorithm.max_num_gen_batches`` batches (or the
        end of the run's data; ``train_step(items)`` has none to read). The selection (``select_groups``) waits on
        the Reward queue for the log-prob recompute; the rest is discarded. The refills' data position moves to
        ``flight.batches_read``, so a checkpoint after this step resumes after them. Runs before a collocated
        step hands the GPU to the actor: the refills need the engine."""
        g, q, alg = self.groups, self.channels, self.cfg.algorithm
        started = time.perf_counter()
        held = q[ch.REWARD].sub(ch.HELD)
        batches, agent_outs, reward_outs = [], [], []
        current = flight
        while True:
            scored = g.reward.compute_rewards(current.results, held, current.groups, self.global_step)
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
        flight.batches_read = current.batches_read
        unit = share_unit(g.placement.actor_world_size, alg.group_size, alg.n_minibatches)
        selection = select_groups(batches, self.cfg.data.rollout_batch_size, unit)
        for result in selection.trained:
            q[ch.REWARD].put(result)
        return DynamicStep(num_results=len(selection.trained), rollout=Ready(merge_agent_outputs(agent_outs)),
                           reward=Ready([merge_reward_outputs(reward_outs)]),
                           metrics=selection.metrics(gen_batches=len(batches)),
                           wait_s=time.perf_counter() - started)

    def _out_of_data(self) -> bool:
        """A dynamic-sampling run reads more than one batch per step, so its data can end before
        ``runner.max_steps``: nothing is in flight and the position is at the end of the last epoch."""
        position = self._trained_position if self._trained_position is not None else self.batches_read
        return self.dynamic_sampling and not self.in_flight and position >= self.order.total_batches

    def _engine_metrics(self, synced: bool) -> dict[str, float]:
        """The rollout engines' re-tokenisation mismatch rate over the prompts served since the last read (this
        step's rollout: validation reads and drops its own) and, after a sync, the probe's log-prob gap."""
        states = wait_or_raise(self.groups.rollout.get_state(), "rollout", "get_state")
        rate, self._engine_counts = engine_mismatch_step(states, self._engine_counts)
        out = {} if rate is None else {mk.RETOKENIZE_MISMATCH: rate}
        gaps = [s["last_sync_logprob_gap"] for s in states if s.get("last_sync_logprob_gap") is not None]
        if synced and gaps:
            out[mk.SYNC_LOGPROB_GAP] = float(max(gaps))
        return out

    @staticmethod
    def _step_metrics(agent_out: list[dict], reward_metrics: dict, rollout_metrics: dict, training: list[dict]) -> dict:
        metrics: dict[str, float] = dict(reward_metrics)
        total = sum(out["num_trajectories"] for out in agent_out) or 1
        keys = set().union(*(out["metrics"].keys() for out in agent_out))
        for key in keys:  # trajectory-weighted mean over agent-loop ranks
            metrics[key] = sum(out["metrics"].get(key, 0.0) * out["num_trajectories"] for out in agent_out) / total
        for key, value in rollout_metrics.items():
            metrics[mk.prefixed(mk.ROLLOUT_PREFIX, key)] = float(value)
        last = training[-1]
        behaviour = tuple(mk.actor_name(key) for key in mk.ACTOR_BEHAVIOUR_METRICS)  # steps weighted by pi_behav
        for key in ("loss", "policy_loss", "kl", "entropy", "grad_norm", "lr", "clip_fraction", "ratio",
                    "approx_kl", "update_success", "advantages_mean", "advantages_max", "advantages_min", *behaviour):
            if key in last:
                metrics[mk.prefixed(mk.ACTOR_PREFIX, key)] = (
                    float(sum(m[key] for m in training) / len(training)) if key != "lr" else float(last[key]))
        metrics[mk.ACTOR_OPTIMIZER_STEPS] = float(sum("loss" in m for m in training))  # 0 in critic.critic_warmup
        metrics.update(critic_step_metrics(training))
        return metrics

    # ------------------------------------------------------------------ validation
    def validation_pass(self):
        """The run's one validation pass (the agent's, built on first call), or None when this run never validates.

        It generates through the rollout group's serving loop from the driver (a ``ChannelGenerator`` on the
        GenerateInput/GenerateOutput channels; replies are keyed by a fresh uuid per request, so they cannot
        mix with the agent loop's), so it needs ``init_workers()`` first.
        """
        if self._validation is None and validation_enabled(self.cfg):
            if self._serving is None:
                raise RuntimeError("validation needs the rollout group's serving loop: call init_workers() first.")
            per_benchmark = self.cfg.runner.val_samples_per_benchmark
            if per_benchmark == 0:
                raise ValueError("runner.val_samples_per_benchmark=0 leaves nothing to validate; "
                                 "use N > 0 questions per benchmark, or -1 for all of them.")
            self._validation = validation_pass_class(self.cfg)(
                self.cfg, ChannelGenerator(*self.generate_channels),
                samples_per_benchmark=per_benchmark, do_sample=False,
                out_dir=self.run_dir / VALIDATION_DIR,
            )
        return self._validation

    def validate(self, step: int) -> dict[str, float]:
        """Validate the actor's current weights: sync actor -> rollout (the step-start sync happened before this
        step's update), run the pass. The engine keeps the GPU and these weights afterwards (the actor is
        offloaded at this point of a collocated run), so the next step starts without a second sync of the same
        weights. Returns val/... + time/validation."""
        if not should_validate(self.cfg, step):
            return {}
        started = time.perf_counter()
        self._sync_weights()
        metrics = dict(self.validation_pass().run(step))
        if self.reads_engine_state:  # the validation's prompts are not the next step's
            self._engine_metrics(synced=False)
        metrics[mk.TIME_VALIDATION] = time.perf_counter() - started
        self.val_history[step] = metrics
        tqdm.write(f"[rlinf_ext] validation at step {step} ({metrics[mk.TIME_VALIDATION]:.1f} s): "
                   f"{self.validation_pass().summary(metrics)}")
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        tmp = staging_dir(self.ckpt_root, self.global_step)
        wait_or_raise(self.groups.actor.save_checkpoint(str(tmp / "actor"), self.global_step), "actor", "save_checkpoint")
        (tmp / "data").mkdir()
        # the position after the last trained batch: the batches read ahead are trained again after a resume
        position = self._trained_position if self._trained_position is not None else self.batches_read
        save_position(self.order, position, tmp / "data" / "data.pt")
        return finalize(tmp, self.global_step, {"experiment": self.cfg.runner.experiment_name})

    def _save_due(self, last: bool) -> bool:
        interval = self.cfg.runner.save_interval
        return last or (interval > 0 and self.global_step % interval == 0)

    # ------------------------------------------------------------------ loop
    def _finish_step(self, metrics: dict, trajectories: list) -> tuple[bool, Path | None]:
        """Checkpoint when due (or when a stop was asked for), validate, report the step; returns (stop the
        loop, the checkpoint written)."""
        last = self.global_step >= self.max_steps or self._out_of_data()
        stop = not last and self.should_stop()
        ckpt = self.save_checkpoint() if self._save_due(last) or stop else None
        if not stop:
            metrics.update(self.validate(self.global_step))
        if self.on_step is not None:
            self.on_step(self.global_step, metrics, trajectories)
        if stop:
            self.stopped_early = True
            tqdm.write(f"[rlinf_ext] stop asked for: checkpoint {ckpt} written after step {self.global_step}")
        return last or stop, ckpt

    def _take_launch_metrics(self) -> dict[str, float]:
        taken, self._launch_metrics = self._launch_metrics, {}
        return taken

    def run(self) -> dict:
        rewards: list[float] = []
        last_ckpt: Path | None = None
        if self.global_step >= self.max_steps:
            warnings.warn(f"nothing to do: step {self.global_step} >= max steps {self.max_steps}", RuntimeWarning)
        if self.global_step == 0:  # before the first step; a resumed run validated its start already
            before = self.validate(0)
            if before:
                before = {**before, **self._take_launch_metrics()}
            if before and self.on_step is not None:
                self.on_step(0, before, [])  # no trajectories, no reward/...: only the val/... curves get a point
        self.stopped_early = self.global_step < self.max_steps and self.should_stop()
        bar = tqdm(total=self.max_steps, initial=self.global_step, desc="train", unit="step")
        self._batches = self._order_batches()
        try:
            done = self.stopped_early
            while not done and self.global_step < self.max_steps and not self._out_of_data():
                metrics, trajectories = self.train_step()
                metrics.update(self._take_launch_metrics())
                for k, v in metrics.items():
                    if isinstance(v, float) and not math.isfinite(v):
                        warnings.warn(f"step {self.global_step}: metric {k} is {v}", RuntimeWarning)
                self.history.append(metrics)
                rewards.append(metrics[mk.REWARD_MEAN])
                done, ckpt = self._finish_step(metrics, trajectories)
                last_ckpt = ckpt or last_ckpt
                bar.update(1)
                bar.set_postfix(reward=f"{metrics[mk.REWARD_MEAN]:.3f}", loss=f"{metrics.get(mk.ACTOR_LOSS, math.nan):.4f}")
        finally:
            bar.close()
        drained = self.drain()  # a stop leaves the batches read ahead in flight (never on an error: see shutdown)
        if drained:
            tqdm.write(f"[rlinf_ext] {len(drained)} batch(es) in flight after step {self.global_step} were aborted "
                       "and discarded (a resume rolls them out again)")
        for batch, error in drained:
            if error is not None and not is_cancellation(error):
                tqdm.write(f"[rlinf_ext] discarded batch {batch} ended with {type(error).__name__}: {error}")
        return {
            "steps": self.global_step,
            "steps_this_run": len(rewards),
            "first_reward": rewards[0] if rewards else None,
            "last_reward": rewards[-1] if rewards else None,
            "checkpoint_dir": str(last_ckpt) if last_ckpt else None,
            "resumed_from": str(self.resume_dir) if self.resume_dir else None,
            "last_validation": self.val_history[max(self.val_history)] if self.val_history else None,
            "stopped_early": self.stopped_early,
        }

    def shutdown(self) -> None:
        """Stop the serving loops (the Ray cluster itself belongs to the caller). Batches still in flight (``run``
        raised) are not waited for: their agent loops end with the worker groups the caller stops next."""
        self.in_flight.clear()
        if self._serving is None:
            return
        for _ in range(self.groups.placement.rollout_dp_size):
            stop: GenerateRequest = {"channel_key": STOP_SERVING}
            self.channels[ch.GENERATE_INPUT].put(stop)
        self._serving.wait()
        self._serving = None
