"""Search-R1 GRPO runner on RLinf's scheduler (docs/contracts.md §7).

It follows RLinf's ``AgentRunner`` step by step — put the batch on the ``DataLoader`` channel, sync weights
actor -> rollout, agent-loop rollout (generation through the rollout group, search through the search tool),
rewards, recompute old/reference log-probs, train, checkpoint — but is our own code, because RLinf's runner
module imports Megatron-LM's training package at load time (rlinf-protocol.md §10). Worker method names and
channel payloads are RLinf's, so the same runner drives the CPU workers and RLinf-derived GPU workers.

Validation during training (``rlinf_ext.eval.validation``): before the first step (``runner.val_before_train``)
and after every ``runner.val_check_interval`` steps, the actor's weights are synced to the rollout group and a
greedy pass over a fixed subset runs from the driver through the rollout group; its ``val/...`` metrics join
that step's metrics (step 0: an ``on_step(0, metrics, [])`` call of its own).

Collocated GPU runs (actor and rollout on the same GPUs, ``placement.on_gpu and not is_pipeline``) follow
RLinf's non-pipelined order so the two never hold the GPU at once: the rollout initialises (and releases its
memory) before the actor does, and the actor offloads after start-up; each step waits for the whole rollout,
offloads the rollout engine, onloads the actor, then computes rewards, log-probs and the update, and
offloads the actor again. CPU and disaggregated runs keep the overlapped order.
"""

from __future__ import annotations

import json
import math
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rlinf_ext.engines.checkpoint import check_complete, finalize, latest_complete_checkpoint, staging_dir, step_of
from rlinf_ext.runner.groups import WorkerGroups, wait_or_raise

StepCallback = Callable[[int, dict, list], None]
VALIDATION_DIR = "validation"  # <run_dir>/validation/global_step_<N>/generations.jsonl


def validation_enabled(cfg: Any) -> bool:
    """Whether any step of this run can validate (``rlinf_ext.eval.validation.should_validate`` is true for some
    step): ``runner.val_before_train`` or ``runner.val_check_interval > 0``, with ``data.val_data_paths`` set."""
    runner = cfg.runner
    wanted = bool(runner.val_before_train) or int(runner.val_check_interval) > 0
    return wanted and bool(list(cfg.data.val_data_paths))


# --------------------------------------------------------------------------------------------- data
def load_jsonl_prompts(paths: Sequence[str | Path], prompt_key: str = "prompt", answer_key: str = "solutions",
                       data_size: int = -1) -> list[dict]:
    """RLinf-style jsonl rows ``{prompt, solutions, uid?}`` -> ``[{"prompt", "answers", "uid"}]``."""
    rows: list[dict] = []
    for path in paths:
        with open(path) as f:
            file_rows = [json.loads(line) for line in f if line.strip()]
        if data_size >= 0:
            file_rows = file_rows[:data_size]
        for i, row in enumerate(file_rows):
            if prompt_key not in row or answer_key not in row:
                raise ValueError(f"{path}:{i + 1}: row lacks {prompt_key!r} or {answer_key!r} (data.prompt_key/answer_key).")
            rows.append({"prompt": row[prompt_key], "answers": row[answer_key], "uid": str(row.get("uid", f"{Path(path).stem}-{i}"))})
    return rows


class PromptDataset(torch.utils.data.Dataset):
    """Tokenised prompts ``{"prompt_ids", "answers", "uid"}``; over-long prompts are dropped (counted)."""

    def __init__(self, rows: Sequence[dict], tokenizer: Any, max_prompt_length: int):
        self.items = []
        self.dropped = 0
        for row in rows:
            ids = row.get("prompt_ids")
            if ids is None:
                ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
            if len(ids) > max_prompt_length:
                self.dropped += 1
                continue
            self.items.append({"prompt_ids": list(ids), "answers": row["answers"], "uid": str(row.get("uid", len(self.items)))})
        if not self.items:
            raise ValueError(f"no prompt fits data.max_prompt_length={max_prompt_length} ({self.dropped} dropped).")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def _collate(items: list[dict]) -> list[dict]:
    return items


def split_list(items: list, parts: int) -> list[list]:
    """Contiguous chunks whose sizes differ by at most one (RLinf's ``split_list``)."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


# --------------------------------------------------------------------------------------------- runner
class SearchR1Trainer:
    def __init__(self, cfg: Any, groups: WorkerGroups, train_dataset, val_dataset=None,
                 on_step: StepCallback | None = None, verify_sync: bool = True):
        from rlinf.scheduler import Channel
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.cfg = cfg
        self.groups = groups
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self.on_step = on_step
        self.verify_sync = verify_sync
        self.global_step = 0
        self.history: list[dict[str, float]] = []
        batch = int(cfg.data.rollout_batch_size)
        if len(train_dataset) < batch:
            raise ValueError(f"data.rollout_batch_size={batch} is larger than the training set ({len(train_dataset)} prompts).")
        generator = torch.Generator().manual_seed(int(cfg.data.seed))
        sampler = (torch.utils.data.RandomSampler(train_dataset, generator=generator) if cfg.data.shuffle
                   else torch.utils.data.SequentialSampler(train_dataset))
        self.dataloader = StatefulDataLoader(train_dataset, batch_size=batch, sampler=sampler, drop_last=True,
                                             num_workers=0, collate_fn=_collate)
        self.max_steps = self.total_steps(cfg, len(train_dataset))
        self.run_dir = Path(cfg.runner.output_dir) / str(cfg.runner.experiment_name)
        self.ckpt_root = self.run_dir / "checkpoints"
        from rlinf_ext.engines.channels import KeyedChannel

        # One channel process, one named queue per stage (RLinf's channel names).
        self._channel = Channel.create(f"SearchR1-{cfg.runner.experiment_name}-{uuid.uuid4().hex[:8]}")
        self.channels = {name: KeyedChannel(self._channel, name) for name in
                         ("DataLoader", "GenerateInput", "GenerateOutput", "Rollout", "Reward", "Inference")}
        self.resume_dir: Path | None = None
        self._serving = None
        self._validation = None  # ValidationPass, built on first use (see validation_pass)
        self.val_history: dict[int, dict[str, float]] = {}  # step -> val/... metrics of that pass

    @staticmethod
    def total_steps(cfg: Any, dataset_len: int) -> int:
        """``len(loader) * max_epochs`` capped by ``runner.max_steps`` (RLinf's ``_set_max_steps``)."""
        per_epoch = dataset_len // int(cfg.data.rollout_batch_size)
        steps = per_epoch * int(cfg.runner.max_epochs)
        if int(cfg.runner.max_steps) >= 0:
            steps = min(steps, int(cfg.runner.max_steps))
        return steps

    @property
    def generate_channels(self):
        return self.channels["GenerateInput"], self.channels["GenerateOutput"]

    # ------------------------------------------------------------------ start-up
    def _resolve_resume_dir(self) -> Path | None:
        resume = self.cfg.runner.resume_dir
        if resume is None:
            return None
        if str(resume) == "auto":
            return latest_complete_checkpoint(self.ckpt_root)
        path = Path(str(resume))
        reason = check_complete(path)
        if reason is not None:
            raise ValueError(f"runner.resume_dir={path} is not a complete checkpoint: {reason}. "
                             "Pass another global_step_N directory, 'auto', or null.")
        return path

    @property
    def collocated_gpu(self) -> bool:
        """Actor and rollout share GPUs: they take turns (offload/onload) instead of overlapping."""
        placement = self.groups.placement
        return bool(placement.on_gpu) and not bool(placement.is_pipeline)

    def init_workers(self) -> None:
        g = self.groups
        gen_in, gen_out = self.generate_channels
        handles = [
            ("rollout", "init_worker", g.rollout.init_worker()),
            ("reward", "init_worker", g.reward.init_worker()),
            ("agent_loop", "init_worker", g.agent_loop.init_worker(gen_in, gen_out)),
        ]
        if self.collocated_gpu:  # the rollout releases its GPU memory at the end of its init: wait for it
            wait_or_raise(handles.pop(0)[2], "rollout", "init_worker", startup=True)
        handles.append(("actor", "init_worker", g.actor.init_worker()))
        for component, method, handle in handles:
            wait_or_raise(handle, component, method, startup=True)
        wait_or_raise(g.actor.set_rollout_world_size(g.placement.rollout_dp_size), "actor", "set_rollout_world_size")
        self.resume_dir = self._resolve_resume_dir()
        if self.resume_dir is not None:
            self.global_step = step_of(self.resume_dir)
            wait_or_raise(g.actor.load_checkpoint(str(self.resume_dir / "actor")), "actor", "load_checkpoint")
            data_state = self.resume_dir / "data" / "data.pt"
            if data_state.is_file():
                self.dataloader.load_state_dict(torch.load(data_state, weights_only=False))
            print(f"[rlinf_ext] resumed from {self.resume_dir} (step {self.global_step})", flush=True)
        if self.collocated_gpu:  # the rollout gets the GPU first (weight sync, validation, generation)
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        # Never awaited, like RLinf: the rollout group serves generate requests until shutdown().
        self._serving = g.rollout.rollout_serverless(gen_in, gen_out)
        # Built now (not at the first validation step) so a bad val file fails at start-up, not hours in.
        self.validation_pass()

    # ------------------------------------------------------------------ one step
    def _put_batch(self, items: list[dict]) -> None:
        from rlinf_ext.engines.payloads import SearchRolloutRequest

        parts = self.groups.placement.agent_loop_world_size
        seed = int(self.cfg.runner.seed) * 1_000_003 + self.global_step
        uids = [f"s{self.global_step}-{k:04d}-{it['uid']}" for k, it in enumerate(items)]
        for chunk, chunk_uids in zip(split_list(items, parts), split_list(uids, parts)):
            self.channels["DataLoader"].put(SearchRolloutRequest(
                n=int(self.cfg.algorithm.group_size),
                input_ids=[it["prompt_ids"] for it in chunk],
                image_data=[[] for _ in chunk],
                answers=[it["answers"] for it in chunk],
                multi_modal_inputs=[None for _ in chunk],
                uids=chunk_uids,
                seed=seed,
            ))

    def _sync_weights(self) -> None:
        g = self.groups
        g.actor.sync_model_to_rollout(self.verify_sync)  # not awaited: pairs with the rollout's recv
        wait_or_raise(g.rollout.sync_model_from_actor(), "rollout", "sync_model_from_actor")
        wait_or_raise(g.actor.del_reshard_state_dict(), "actor", "del_reshard_state_dict")

    def train_step(self, items: list[dict]) -> tuple[dict[str, float], list[dict]]:
        g, ch = self.groups, self.channels
        started = time.perf_counter()
        num_results = len(items)
        self._put_batch(items)
        t = time.perf_counter()
        self._sync_weights()
        time_sync = time.perf_counter() - t

        rollout_h = g.agent_loop.run_agentloop_rollout(ch["DataLoader"], ch["Rollout"])
        collocated = self.collocated_gpu
        if collocated:  # RLinf's non-pipelined order: the whole rollout, then the engine gives the GPU back
            agent_out = wait_or_raise(rollout_h, "agent_loop", "run_agentloop_rollout")
            wait_or_raise(g.rollout.offload_engine(), "rollout", "offload_engine")
            wait_or_raise(g.actor.onload_engine(), "actor", "onload_engine")
        reward_h = g.reward.compute_rewards(ch["Rollout"], ch["Reward"], num_results)
        kl = float(self.cfg.algorithm.kl_beta) > 0
        infer_h = g.actor.run_inference(ch["Reward"], ch["Inference"], kl, num_results)
        train_h = g.actor.run_training(ch["Inference"], num_results, self.global_step)

        if not collocated:
            agent_out = wait_or_raise(rollout_h, "agent_loop", "run_agentloop_rollout")
        time_rollout = rollout_h.consume_duration()
        reward_out = wait_or_raise(reward_h, "reward", "compute_rewards")[0]
        wait_or_raise(infer_h, "actor", "run_inference")
        time_recompute = infer_h.consume_duration()
        rollout_metrics, training = wait_or_raise(train_h, "actor", "run_training")[0]
        time_train = train_h.consume_duration()
        if collocated:  # the next step starts with the weight sync into the rollout engine
            wait_or_raise(g.actor.offload_engine(), "actor", "offload_engine")
        else:
            wait_or_raise(g.rollout.offload_engine(), "rollout", "offload_engine")
        self.global_step += 1

        trajectories = [rec for out in agent_out for rec in out["trajectories"]]
        for rec in trajectories:
            rec["reward"] = reward_out["rewards"][rec["uid"]][rec["index"]]
            rec["step"] = self.global_step
        metrics = self._step_metrics(agent_out, reward_out["metrics"], rollout_metrics, training)
        tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in trajectories)
        step_time = time.perf_counter() - started
        metrics.update({
            "time/rollout": float(time_rollout),
            "time/tool": max(out["tool_time"] for out in agent_out),
            "time/recompute": float(time_recompute),
            "time/train": float(time_train),
            "time/sync": time_sync,
            "time/step": step_time,
            "throughput/tokens_per_s": tokens / max(step_time, 1e-9),
        })
        return metrics, trajectories

    @staticmethod
    def _step_metrics(agent_out: list[dict], reward_metrics: dict, rollout_metrics: dict, training: list[dict]) -> dict:
        metrics: dict[str, float] = dict(reward_metrics)
        total = sum(out["num_trajectories"] for out in agent_out) or 1
        keys = set().union(*(out["metrics"].keys() for out in agent_out))
        for key in keys:  # trajectory-weighted mean over agent-loop ranks
            metrics[key] = sum(out["metrics"].get(key, 0.0) * out["num_trajectories"] for out in agent_out) / total
        for key, value in rollout_metrics.items():
            metrics[f"rollout/{key}"] = float(value)
        last = training[-1]
        for key in ("loss", "policy_loss", "kl", "entropy", "grad_norm", "lr", "clip_fraction", "ratio",
                    "approx_kl", "update_success", "advantages_mean", "advantages_max", "advantages_min"):
            if key in last:
                metrics[f"actor/{key}"] = float(sum(m[key] for m in training) / len(training)) if key != "lr" else float(last[key])
        metrics["actor/optimizer_steps"] = float(len(training))
        return metrics

    # ------------------------------------------------------------------ validation
    def validation_pass(self):
        """The run's one ``ValidationPass`` (built on first call), or None when this run never validates.

        It generates through the rollout group's serving loop from the driver (a ``ChannelGenerator`` on the
        GenerateInput/GenerateOutput channels; replies are keyed by a fresh uuid per request, so they cannot
        mix with the agent loop's), so it needs ``init_workers()`` first.
        """
        if self._validation is None and validation_enabled(self.cfg):
            if self._serving is None:
                raise RuntimeError("validation needs the rollout group's serving loop: call init_workers() first.")
            from rlinf_ext.eval import validation
            from rlinf_ext.runner.groups import rollout_generator

            per_benchmark = int(self.cfg.runner.val_samples_per_benchmark)
            if per_benchmark == 0:
                raise ValueError("runner.val_samples_per_benchmark=0 leaves nothing to validate; "
                                 "use N > 0 questions per benchmark, or -1 for all of them.")
            self._validation = validation.ValidationPass(
                self.cfg, rollout_generator(self.groups, *self.generate_channels),
                samples_per_benchmark=per_benchmark, do_sample=False,
                out_dir=self.run_dir / VALIDATION_DIR,
            )
        return self._validation

    def validate(self, step: int) -> dict[str, float]:
        """Validate the actor's current weights: sync actor -> rollout (the step-start sync happened before
        this step's update), run the pass, release the engine as a step does. Returns val/... + time/validation."""
        from rlinf_ext.eval.validation import should_validate

        if not should_validate(self.cfg, step):
            return {}
        started = time.perf_counter()
        self._sync_weights()
        metrics = dict(self.validation_pass().run(step))
        wait_or_raise(self.groups.rollout.offload_engine(), "rollout", "offload_engine")
        metrics["time/validation"] = time.perf_counter() - started
        self.val_history[step] = metrics
        from tqdm import tqdm

        tqdm.write(f"[rlinf_ext] validation at step {step}: EM avg {metrics.get('val/avg/em', float('nan')):.3f}, "
              f"pooled {metrics.get('val/all/em', float('nan')):.3f} over {int(metrics.get('val/n', 0))} questions "
              f"({int(metrics.get('val/errors', 0))} errors, {metrics['time/validation']:.1f} s)")
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        tmp = staging_dir(self.ckpt_root, self.global_step)
        wait_or_raise(self.groups.actor.save_checkpoint(str(tmp / "actor"), self.global_step), "actor", "save_checkpoint")
        (tmp / "data").mkdir()
        torch.save(self.dataloader.state_dict(), tmp / "data" / "data.pt")
        return finalize(tmp, self.global_step, {"experiment": str(self.cfg.runner.experiment_name)})

    def _save_due(self, last: bool) -> bool:
        interval = int(self.cfg.runner.save_interval)
        return last or (interval > 0 and self.global_step % interval == 0)

    # ------------------------------------------------------------------ loop
    def run(self) -> dict:
        from tqdm import tqdm

        rewards: list[float] = []
        last_ckpt: Path | None = None
        if self.global_step >= self.max_steps:
            warnings.warn(f"nothing to do: step {self.global_step} >= max steps {self.max_steps}", RuntimeWarning)
        if self.global_step == 0:  # before the first step; a resumed run validated its start already
            before = self.validate(0)
            if before and self.on_step is not None:
                self.on_step(0, before, [])  # no trajectories, no reward/...: only the val/... curves get a point
        bar = tqdm(total=self.max_steps, initial=self.global_step, desc="train", unit="step")
        try:
            epoch = self.global_step // max(len(self.dataloader), 1)
            while self.global_step < self.max_steps and epoch < int(self.cfg.runner.max_epochs):
                for items in self.dataloader:
                    metrics, trajectories = self.train_step(items)
                    for k, v in metrics.items():
                        if isinstance(v, float) and not math.isfinite(v):
                            warnings.warn(f"step {self.global_step}: metric {k} is {v}", RuntimeWarning)
                    self.history.append(metrics)
                    rewards.append(metrics["reward/mean"])
                    last = self.global_step >= self.max_steps
                    if self._save_due(last):
                        last_ckpt = self.save_checkpoint()
                    metrics.update(self.validate(self.global_step))
                    if self.on_step is not None:
                        self.on_step(self.global_step, metrics, trajectories)
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", loss=f"{metrics['actor/loss']:.4f}")
                    if last:
                        break
                epoch += 1
        finally:
            bar.close()
        return {
            "steps": self.global_step,
            "steps_this_run": len(rewards),
            "first_reward": rewards[0] if rewards else None,
            "last_reward": rewards[-1] if rewards else None,
            "checkpoint_dir": str(last_ckpt) if last_ckpt else None,
            "resumed_from": str(self.resume_dir) if self.resume_dir else None,
            "last_validation": self.val_history[max(self.val_history)] if self.val_history else None,
        }

    def shutdown(self) -> None:
        """Stop the serving loops (the Ray cluster itself belongs to the caller)."""
        from rlinf_ext.engines.rollout_worker import STOP_SERVING

        if self._serving is None:
            return
        for _ in range(self.groups.placement.rollout_dp_size):
            self.channels["GenerateInput"].put({"channel_key": STOP_SERVING})
        self._serving.wait()
        self._serving = None
