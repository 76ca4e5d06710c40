"""The GRPO runner on RLinf's scheduler for both agents, a recipe over ``runner/pipeline.py``: each step syncs weights,
takes the admitted batch, then rewards, old/reference log-probs, the update, a checkpoint when due (contracts §7).
Our own code, after RLinf 0.3.0's ``AgentRunner`` (which imports Megatron-LM's ``megatron.training``, not on PyPI).
Validation runs before the first step and every ``runner.val_check_interval`` steps (a sync, then a greedy pass).
Collocated GPUs follow RLinf's non-pipelined order. SIGTERM finishes the step, checkpoints, drains the batches."""

from __future__ import annotations

import math
import time
import uuid
import warnings
from functools import cached_property
from pathlib import Path
from typing import Callable

from rlinf.scheduler import Channel
from tqdm import tqdm

from rlinf_ext.config.placement import is_collocated
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.eval.core.validation import build_validation_pass, should_validate, validation_enabled
from rlinf_ext.protocol import channels as ch
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.channels import KeyedChannel
from rlinf_ext.protocol.generation import STOP_SERVING, GenerateRequest
from rlinf_ext.runner.checkpoints import check_complete, finalize, latest_complete_checkpoint, staging_dir, step_of
from rlinf_ext.runner.data_order import batch_order, load_in_flight, load_position, save_position
from rlinf_ext.runner.groups import WorkerGroups, is_cancellation, wait_all_or_raise, wait_or_raise
from rlinf_ext.runner.pipeline import BatchPipeline, sync_due
from rlinf_ext.runner.step_metrics import (
    EngineCounters,
    StepClock,
    engine_counts_mismatches,
    flow_metrics,
    outcome_metrics,
)
from rlinf_ext.workers.agent_loop import ChannelGenerator
from rlinf_ext.workers.returns import scored_trajectories

StepCallback = Callable[[int, dict, list], None]


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


# --------------------------------------------------------------------------------------------- runner
class GRPOTrainer:
    engine_counters: EngineCounters | None = None  # __init__: for engines that re-count prompts; bare fakes: None

    def __init__(
        self,
        cfg: ExperimentConfig,
        groups: WorkerGroups,
        train_dataset,
        val_dataset=None,
        on_step: StepCallback | None = None,
        verify_sync: bool = True,
        should_stop: Callable[[], bool] | None = None,
    ):
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
        self.history: list[dict[str, float]] = []
        batch = cfg.data.rollout_batch_size
        if len(train_dataset) < batch:
            raise ValueError(
                f"data.rollout_batch_size={batch} is larger than the training set ({len(train_dataset)} prompts)."
            )
        self.max_steps = self.total_steps(cfg, len(train_dataset))
        self.run_dir = Path(cfg.runner.output_dir) / cfg.runner.experiment_name
        self.ckpt_root = self.run_dir / "checkpoints"
        # One channel process, one named queue per stage (RLinf's channel names).
        self._channel = Channel.create(f"SearchR1-{cfg.runner.experiment_name}-{uuid.uuid4().hex[:8]}")
        self.channels = {name: KeyedChannel(self._channel, name) for name in ch.STEP_CHANNELS}
        self.pipeline = BatchPipeline(
            cfg,
            groups,
            self.channels,
            cfg.runner.max_staleness,
            batch_order(cfg, len(train_dataset)),
            train_dataset,
            self.max_steps,
        )
        self.resume_dir: Path | None = None
        self._serving = None
        self._validation = None  # ValidationPass, built on first use (see validation_pass)
        self.val_history: dict[int, dict[str, float]] = {}  # step -> val/... metrics of that pass
        self._rollout_current = False  # the rollout engine holds the actor's current weights
        self._sync_parts: dict[str, float] = {}  # the last sync's rollout-side parts (time/sync/<part>)
        self._launch_metrics: dict[str, float] = {}  # logged once, in this launch's first row
        if engine_counts_mismatches(cfg):
            self.engine_counters = EngineCounters(groups.rollout)

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
            raise ValueError(
                f"runner.resume_dir={path} is not a complete checkpoint: {reason}. "
                "Pass another global_step_N directory, 'auto', or null."
            )
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
        self._launch_metrics = {
            mk.TIME_ROLLOUT_START: float(rollout_init.consume_duration()),
            **part_metrics(results["rollout"], mk.TIME_ROLLOUT_START),
        }
        routes = g.placement.weight_sync
        wait_or_raise(g.actor.set_weight_sync(routes), "actor", "set_weight_sync")
        wait_or_raise(g.rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
        self.resume_dir = self._resolve_resume_dir()
        if self.resume_dir is not None:
            self.global_step = step_of(self.resume_dir)
            wait_or_raise(g.actor.load_checkpoint(str(self.resume_dir / "actor")), "actor", "load_checkpoint")
            data_state = self.resume_dir / "data" / "data.pt"
            self.pipeline.resume_at(
                load_position(self.pipeline.order, data_state, self.global_step)
                if data_state.is_file()
                else self.global_step,
                load_in_flight(data_state) if data_state.is_file() else (),
            )
            print(f"[rlinf_ext] resumed from {self.resume_dir} (step {self.global_step})", flush=True)
        if self.collocated_gpu:  # the rollout gets the GPU first (weight sync, validation, generation)
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        # Never awaited, like RLinf: the rollout group serves generate requests until shutdown().
        self._serving = g.rollout.rollout_serverless(gen_in, gen_out)
        # Built now (not at the first validation step) so a bad val file fails at start-up, not hours in.
        self.validation_pass()

    # ------------------------------------------------------------------ one step
    def _sync_weights(self) -> bool:
        """Actor -> rollout weight sync (both sides at once: a failure on either is raised, not waited on); skipped
        when the engine already holds the actor's current weights (validation synced them after the last
        update and nothing dropped them since)."""
        if self._rollout_current:
            return False
        g = self.groups
        version = {"version": self.global_step}
        _, received = wait_all_or_raise(
            [
                (g.actor.sync_model_to_rollout(self.verify_sync), "actor", "sync_model_to_rollout"),
                (g.rollout.sync_model_from_actor(**version), "rollout", "sync_model_from_actor"),
            ]
        )
        self._sync_parts = part_metrics(received, mk.TIME_SYNC)
        self._rollout_current = True
        self.pipeline.synced(self.global_step)
        return True

    def _offload_rollout(self) -> None:
        wait_or_raise(self.groups.rollout.offload_engine(), "rollout", "offload_engine")
        if self.collocated_gpu:  # SGLang's memory saver keeps no copy: the weights are gone until the next sync
            self._rollout_current = False

    def train_step(self, items: list[dict] | None = None) -> tuple[dict[str, float], list[dict]]:
        """Train batch ``global_step``: sync the weights, take the batch the pipeline admits (``items``: the one
        batch to dispatch, for a caller that feeds the batches itself, k = 0), then reward, log-probs, update."""
        g, q, clock, collocated = self.groups, self.channels, StepClock(), self.collocated_gpu
        with clock.part(mk.TIME_SYNC):
            synced = (
                sync_due(
                    self.global_step,
                    self.pipeline.engine_version,
                    self.cfg.runner.sync_every,
                    self.pipeline.max_staleness,
                )
                and self._sync_weights()
            )
        if not synced:  # a skipped sync is no 0-second sync: it would pull the mean sync time down
            del clock.parts[mk.TIME_SYNC]
        batch = self.pipeline.next_batch(self.global_step, items)
        clock.add(mk.TIME_WAIT_ROLLOUT, batch.wait_s)
        if collocated:  # RLinf's non-pipelined order: the whole rollout, then the engine gives the GPU back
            with clock.part(mk.TIME_WAIT_ROLLOUT):
                outs = wait_or_raise(batch.rollout, "agent_loop", "run_agentloop_rollout")
            self._offload_rollout()
            wait_or_raise(g.actor.onload_engine(), "actor", "onload_engine")
        reward_h = batch.score(g.reward, q[ch.REWARD], self.global_step)
        infer_h = g.actor.run_inference(
            q[ch.REWARD], q[ch.INFERENCE], self.cfg.algorithm.kl_beta > 0, batch.num_results
        )
        train_h = g.actor.run_training(q[ch.INFERENCE], batch.num_results, self.global_step)
        if not collocated:
            with clock.part(mk.TIME_WAIT_ROLLOUT):
                outs = wait_or_raise(batch.rollout, "agent_loop", "run_agentloop_rollout")
        reward = wait_or_raise(reward_h, "reward", "compute_rewards")[0]
        wait_or_raise(infer_h, "actor", "run_inference")
        clock.add(mk.TIME_RECOMPUTE, infer_h.consume_duration())
        rollout_metrics, training = wait_or_raise(train_h, "actor", "run_training")[0]
        self._rollout_current = False  # the actor's weights changed
        clock.add(mk.TIME_TRAIN, train_h.consume_duration())
        if collocated:  # the next step starts with the weight sync into the rollout engine
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        else:
            self._offload_rollout()
        self.global_step += 1

        trajectories = scored_trajectories(outs, reward, self.global_step)
        metrics = outcome_metrics(outs, reward.metrics, rollout_metrics, training)
        metrics.update(flow_metrics(batch, outs, trajectories, clock, self.pipeline))
        metrics.update(batch.metrics)
        if synced:
            metrics.update(self._sync_parts)
        if self.engine_counters is not None:
            metrics.update(self.engine_counters.read(synced))
        return metrics, trajectories

    # ------------------------------------------------------------------ validation
    def validation_pass(self):
        """The run's one validation pass (built on first call; None when the run never validates). It generates
        through the rollout group's serving loop from the driver (replies keyed by a fresh uuid per request), so
        it needs ``init_workers()`` first."""
        if self._validation is None and validation_enabled(self.cfg):
            if self._serving is None:
                raise RuntimeError("validation needs the rollout group's serving loop: call init_workers() first.")
            self._validation = build_validation_pass(self.cfg, ChannelGenerator(*self.generate_channels), self.run_dir)
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
        if self.engine_counters is not None:  # the validation's prompts are not the next step's
            self.engine_counters.read(synced=False)
        metrics[mk.TIME_VALIDATION] = time.perf_counter() - started
        self.val_history[step] = metrics
        tqdm.write(
            f"[rlinf_ext] validation at step {step} ({metrics[mk.TIME_VALIDATION]:.1f} s): "
            f"{self.validation_pass().summary(metrics)}"
        )
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        tmp = staging_dir(self.ckpt_root, self.global_step)
        wait_or_raise(
            self.groups.actor.save_checkpoint(str(tmp / "actor"), self.global_step), "actor", "save_checkpoint"
        )
        (tmp / "data").mkdir()
        # batch admission: the position after the last trained batch (the batches read ahead are rolled out again
        # after a resume); group admission: the batches dispatched, and which of their prompts are untrained
        save_position(
            self.pipeline.order, self.pipeline.position(), tmp / "data" / "data.pt", self.pipeline.in_flight_prompts()
        )
        return finalize(tmp, self.global_step, {"experiment": self.cfg.runner.experiment_name})

    def _save_due(self, last: bool) -> bool:
        interval = self.cfg.runner.save_interval
        return last or (interval > 0 and self.global_step % interval == 0)

    # ------------------------------------------------------------------ loop
    def _finish_step(self, metrics: dict, trajectories: list) -> tuple[bool, Path | None]:
        """Checkpoint when due (or when a stop was asked for), validate, report the step; returns (stop the
        loop, the checkpoint written)."""
        last = self.global_step >= self.max_steps or self.pipeline.exhausted()
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
        self.pipeline.start()
        try:
            done = self.stopped_early
            while not done and self.global_step < self.max_steps and not self.pipeline.exhausted():
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
                bar.set_postfix(
                    reward=f"{metrics[mk.REWARD_MEAN]:.3f}", loss=f"{metrics.get(mk.ACTOR_LOSS, math.nan):.4f}"
                )
        finally:
            bar.close()
        drained = (
            self.pipeline.drain()
        )  # a stop leaves the batches read ahead in flight (never on an error: see shutdown)
        if drained:
            tqdm.write(
                f"[rlinf_ext] {len(drained)} batch(es) in flight after step {self.global_step} were aborted "
                "and discarded (a resume rolls them out again)"
            )
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
        self.pipeline.forget()
        if self._serving is None:
            return
        for _ in range(self.groups.placement.rollout_dp_size):
            stop: GenerateRequest = {"channel_key": STOP_SERVING}
            self.channels[ch.GENERATE_INPUT].put(stop)
        self._serving.wait()
        self._serving = None
