"""RLinf worker around the actor's policy, with the method names of RLinf's ``MegatronActor``: the Megatron-core
policy for text models, or the HF vision-language policy (``actor.training_backend: fsdp``, ``build_policy``).

``init_worker``, ``sync_model_to_rollout``, ``run_inference`` (recompute old
and reference log-probs), ``run_training`` (returns ``(rollout_metrics, training_metrics_list)``),
``save_checkpoint`` / ``load_checkpoint``, and ``offload_engine`` / ``onload_engine``: on CUDA they move the
weights (``actor.offload_weight``: policy + reference), the optimizer state (``actor.offload_optimizer``) and
the gradient buffer (``actor.offload_grad``) off the GPU and back — the runner calls them only when the actor
shares its GPUs with the rollout (collocated); on CPU they are no-ops. Training and log-prob calls onload first
if needed. Weights go to the rollout in the rollout's dtype, along the routes of ``sync/weight_sync.py``.
A threaded (sync) actor, like RLinf's, so
calls run in submission order.

PPO (``algorithm.adv_type: gae``): the critic (``training/critic.py``) lives in the same processes, built after
the policy on the same data-parallel group. ``run_training`` computes its values, the GAE, trains the critic on the
policy's mini-batches, then the policy (not during ``critic.critic_warmup``); the critic offloads with the actor,
and right after its update while the policy trains (``critic.offload``). Its checkpoint is the ``critic`` directory
beside the actor's (``CRITIC_DIR``), saved and loaded with it, so resume and the SIGTERM checkpoint carry it.

Data parallelism: the group's N processes are N data-parallel ranks (TP=PP=1 each; torch.distributed on
RLinf's ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``, gloo on CPU, nccl on CUDA). The runner calls
every method on the whole group with the step's total ``num_results``; each rank takes ``num_results / N``
results (whole GRPO groups) and ``training/data_parallel.py`` makes the update that of one process on the whole
batch. Every rank sends its weights to the engine on its own GPU when collocated (rank 0 broadcasts them
when disaggregated); rank 0 writes checkpoints; every rank loads them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import torch
from rlinf.scheduler import Worker

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.convert.state_dicts import iter_megatron_to_hf
from rlinf_ext.models.cpu_shims import env_init_method, init_parallel_state
from rlinf_ext.models.memory import BUCKET_BYTES
from rlinf_ext.protocol.payloads import AgentRolloutResult, pad_rows
from rlinf_ext.sync.sglang_transfer import SGLangDistributedSender, uses_sglang_distributed
from rlinf_ext.sync.vllm_transfer import VLLMTransferSender, transfer_backend
from rlinf_ext.sync.weight_sync import (
    CastView,
    SyncHeader,
    SyncRoutes,
    SyncStats,
    pack_buckets,
    prepare_handles,
    probe_ids,
    rollout_dtype,
    send_weights,
)
from rlinf_ext.training.data_parallel import DataParallel, shard_layout, share_of
from rlinf_ext.training.grpo_policy import MMSample, Sample
from rlinf_ext.training.settings import ActorSettings, CriticSettings
from rlinf_ext.training.staleness_bound import check_token_bound

if TYPE_CHECKING:  # the policies import Megatron / transformers: only build_policy, in the worker, loads them
    from rlinf_ext.training.critic import MegatronCritic
    from rlinf_ext.training.fsdp_policy import FSDPPolicy
    from rlinf_ext.training.megatron_policy import MegatronPolicy


CRITIC_DIR = "critic"  # the critic's checkpoint: <global_step_N>/critic, beside <global_step_N>/actor


def critic_dir(actor_dir: str) -> str:
    """Where the critic's checkpoint lies for the actor's ``actor_dir``."""
    return os.path.join(os.path.dirname(os.path.normpath(actor_dir)), CRITIC_DIR)


def samples_of(results: list[AgentRolloutResult]) -> list[Sample]:
    """Flatten results (group order kept) into actor samples, with rewards, recomputed log-probs, the engine's
    sampled log-probs and per-token weight versions when the result carries them (and each trajectory's images
    when it carries them: ``MMSample`` for the vision-language actor)."""
    out: list[Sample] = []
    for res in results:
        rewards = (
            res.rewards.tolist() if torch.is_tensor(res.rewards) else list(res.rewards or [0.0] * res.num_sequence)
        )
        versions = getattr(res, "versions", None) or []  # per response token, when the engine stamped its replies
        for i in range(res.num_sequence):
            n = res.response_lengths[i]
            fields = dict(
                prompt_ids=res.prompt_ids[i],
                response_ids=res.response_ids[i],
                response_mask=res.response_mask[i],
                reward=float(rewards[i]),
                old_logprobs=None if res.recomputed_logprobs is None else res.recomputed_logprobs[i, :n].clone(),
                ref_logprobs=None if res.ref_logprobs is None else res.ref_logprobs[i, :n].clone(),
                behaviour_logprobs=_row(res.rollout_logprobs, i, n),
                versions=list(versions[i]) if i < len(versions) and versions[i] else None,
                uid=f"{res.uid}#{i}",
            )
            out.append(
                MMSample(**fields, images=list(res.trajectory_images[i])) if res.trajectory_images else Sample(**fields)
            )
    return out


def _row(rows, i: int, n: int) -> torch.Tensor | None:
    """Row ``i``'s first ``n`` values as float32 (``rows``: a ``[N, max_len]`` tensor, RLinf's list of lists, or
    None)."""
    if rows is None or rows[i] is None:
        return None
    row = rows[i][:n]
    return row.detach().to(torch.float32).clone() if torch.is_tensor(row) else torch.tensor(row, dtype=torch.float32)


def build_policy(cfg: ExperimentConfig, settings: ActorSettings) -> MegatronPolicy | FSDPPolicy:
    """``actor.training_backend``: megatron (text models) or fsdp (Qwen2.5-VL, transformers' model; FSDP2 over the
    data-parallel group set up by ``_init_data_parallel``)."""
    path = cfg.rollout.model.model_path
    if uses_hf_policy(cfg):
        # lazy: heavy (transformers, Megatron via data_parallel); loaded in the actor's process only
        from rlinf_ext.training.fsdp_policy import FSDPPolicy, FSDPSettings

        return FSDPPolicy(
            path, settings, dp=DataParallel.from_parallel_state(), fsdp=FSDPSettings.from_config(cfg.actor.fsdp_config)
        )
    # lazy: heavy (Megatron-core); loaded in the actor's process only, never in the launcher
    from rlinf_ext.training.megatron_policy import MegatronPolicy

    return MegatronPolicy(path, settings)


def uses_hf_policy(cfg: ExperimentConfig) -> bool:
    """The HF (FSDP2) policy, whose names are the engine's already, rather than the Megatron-core one."""
    return cfg.actor.training_backend == "fsdp"


def rollout_metrics(samples: list[Sample], dp: DataParallel) -> dict[str, float]:
    """RLinf's rollout metrics over the step's GLOBAL batch (every rank's samples)."""
    mine = [(s.reward, len(s.response_ids), len(s.prompt_ids), sum(s.response_mask)) for s in samples]
    stats = [row for part in dp.gather_objects(mine) for row in part]
    rewards = torch.tensor([r for r, _, _, _ in stats], dtype=torch.float64)
    lengths = torch.tensor([n for _, n, _, _ in stats], dtype=torch.float64)
    return {
        "total_num_sequence": float(len(stats)),
        "reward_scores": float(rewards.mean()),
        "average_response_length": float(lengths.mean()),
        "max_of_response_length": float(lengths.max()),
        "min_of_response_length": float(lengths.min()),
        "prompt_length": float(sum(p for _, _, p, _ in stats) / len(stats)),
        "loss_tokens": float(sum(t for _, _, _, t in stats)),
    }


class ActorWorker(Worker):
    """The policy trainer of one data-parallel rank (TP=PP=1 per process; DP = the group's size)."""

    def __init__(self, cfg: ExperimentConfig, total_train_steps: int):
        super().__init__()
        self.cfg = cfg
        self.settings = ActorSettings.from_config(cfg, total_train_steps)
        self.policy: MegatronPolicy | FSDPPolicy | None = None
        self.critic_settings = CriticSettings.from_config(cfg, self.settings) if cfg.critic.use_critic_model else None
        self.critic: MegatronCritic | None = None
        self._sync_routes: SyncRoutes | None = None  # set by the runner once the rollout group exists
        self._sync_bucket_bytes = BUCKET_BYTES
        # GPU routes through an engine's own API: vLLM's weight transfer, SGLang's distributed update (disaggregated)
        self._engine_sender: VLLMTransferSender | SGLangDistributedSender | None = None

    # ------------------------------------------------------------------ lifecycle
    def init_worker(self) -> None:
        with self.worker_timer():
            torch.set_num_threads(max(torch.get_num_threads(), 1))
            self._init_data_parallel()
            self.policy = build_policy(self.cfg, self.settings)
            if self.critic_settings is not None:
                from rlinf_ext.training.critic import MegatronCritic  # lazy: Megatron-core, in the worker only

                self.critic = MegatronCritic(self.critic_settings)
            self.log_info(
                f"actor rank {self._rank}/{self._world_size} ready on {self.policy.device}: "
                f"{sum(p.numel() for p in self.policy.model.parameters()):,} params, data-parallel size "
                f"{self.policy.dp.size}, reference={'yes' if self.policy.ref_model is not None else 'no'}, "
                f"critic={'yes' if self.critic is not None else 'no'}"
            )

    def _init_data_parallel(self) -> None:
        """torch.distributed + Megatron parallel_state over this group's processes (TP=PP=1, DP=world size).

        A second ``init_worker`` in the same process (resume tests) reuses the existing process group."""
        world = max(int(self._world_size), 1)
        if torch.cuda.is_available():  # NOT GPU-verified: RLinf's LOCAL_RANK is the device of this process
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        init_method = env_init_method() if world > 1 else None
        if world > 1 and init_method is None:
            raise RuntimeError(
                "the actor group has several processes but RLinf set no MASTER_ADDR/MASTER_PORT; "
                "launch the actor as an RLinf WorkerGroup (runner/compose.py)."
            )
        init_parallel_state(
            1,
            1,
            rank=int(self._rank) if world > 1 else 0,
            world_size=world,
            init_method=init_method,
            seed=self.settings.seed,
            timeout_s=60.0 * self.settings.distributed_timeout_minutes,
        )

    def offload_engine(self) -> None:
        """Give the GPU to the collocated rollout engine (no-op on CPU, see ``MegatronPolicy.offload``)."""
        with self.worker_timer():
            self.policy.offload()  # actor.offload_weight / offload_optimizer / offload_grad (ActorSettings)
            if self.critic is not None:
                self.critic.offload()  # critic.offload; it onloads itself when the step reaches it

    def onload_engine(self) -> None:
        with self.worker_timer():
            self.policy.onload()

    # ------------------------------------------------------------------ weight sync (actor side)
    def set_weight_sync(self, routes: SyncRoutes, bucket_bytes: int = BUCKET_BYTES) -> None:
        """Who receives this rank's weights (``sync/weight_sync.py``); called once by the runner."""
        self._sync_routes = routes
        self._sync_bucket_bytes = int(bucket_bytes)
        cuda = self.policy.device.type == "cuda"
        backend = transfer_backend(self.cfg, cuda)
        if backend is not None:
            self._engine_sender = VLLMTransferSender(
                self, backend, routes, rollout_group=self.cfg.rollout.group_name, bucket_bytes=self._sync_bucket_bytes
            )
        elif uses_sglang_distributed(self.cfg, cuda):
            self._engine_sender = SGLangDistributedSender(
                self, routes, rollout_group=self.cfg.rollout.group_name, bucket_bytes=self._sync_bucket_bytes
            )

    def sync_model_to_rollout(self, verify: bool = True) -> dict:
        """Send the weights under HF names, in the rollout's dtype, along the routes (every rank in parallel on
        the paired route; rank 0 on the broadcast route), with the probe logits when ``verify``. Returns what
        was sent (``SyncStats`` as a dict)."""
        with self.worker_timer():
            routes = self._sync_routes
            if routes is None:
                raise RuntimeError("sync_model_to_rollout before set_weight_sync: the runner sets the routes at start")
            if self._engine_sender is not None:
                return self._sync_through_engine(verify)
            targets = routes.targets_of(self._rank)
            hf_backend = uses_hf_policy(self.cfg)
            if hf_backend:  # FSDP2: the probe forward and the gathers are collective: every rank joins
                paired = routes.mode == "paired"
                header, passes = self._fsdp_policy_payload(verify, every_rank_sends=paired)
                buckets = pack_buckets(passes(), self._sync_bucket_bytes, shared=paired)
            if not targets:  # broadcast route: rank 0 sends (the others hold the same weights; FSDP2: none)
                return dataclasses.asdict(SyncStats(routes.mode))
            if not hf_backend:
                header = SyncHeader(version=self.policy.optimizer_steps, sender=self._rank)
                if verify and targets[0][1] == 0:  # TP slot 0 of an engine carries the probe for that engine
                    ids = probe_ids(self.policy.model.hf_vocab_size)
                    header.probe_ids, header.probe_logits = ids, self.policy.probe_logits(ids)
                buckets = self._hf_buckets(shared=routes.mode == "paired")
            if routes.mode == "paired":
                prepare_handles(self.policy.device)
            stats = send_weights(
                self,
                routes,
                header,
                buckets,
                actor_group=self.cfg.actor.group_name,
                rollout_group=self.cfg.rollout.group_name,
            )
            return dataclasses.asdict(stats)

    def _sync_through_engine(self, verify: bool) -> dict:
        """GPU rollout through the engine's own API, the probe header first: vLLM's weight transfer
        (``sync/vllm_transfer.py``: CUDA IPC collocated, NCCL disaggregated) or SGLang's weight-update group
        (``sync/sglang_transfer.py``, disaggregated). NOT GPU-verified."""
        if uses_hf_policy(self.cfg):  # the gathers and the probe are collective: every rank joins
            # CUDA IPC: every rank hands its own GPU's copy to its engine; NCCL and SGLang's group: rank 0 sends
            every_rank_sends = self._engine_sender.backend == "ipc"
            header, passes = self._fsdp_policy_payload(verify, every_rank_sends=every_rank_sends)
        else:
            header = SyncHeader(version=self.policy.optimizer_steps, sender=self._rank)
            if verify and self._rank == 0:
                ids = probe_ids(self.policy.model.hf_vocab_size)
                header.probe_ids, header.probe_logits = ids, self.policy.probe_logits(ids)
            passes = self._hf_named
        # a collocated (ipc) sender frees this rank's transfer memory before its engine maps the KV cache again
        self._engine_sender.sync(header, passes)
        return {"mode": self._engine_sender.backend, "version": header.version}

    def _fsdp_policy_payload(self, verify: bool, *, every_rank_sends: bool):
        """Header (with the multimodal probe) and weight passes of the HF actor, whose names are the engine's
        already. ``passes()`` starts one pass of ``(name, tensor)`` on this rank's device in the rollout's dtype.

        ``every_rank_sends`` (collocated: each rank feeds the engine on its own GPU): every pass all-gathers the
        shards one tensor at a time on every rank (``FSDPPolicy.iter_hf_weights``), so each rank must run the same
        passes. Otherwise rank 0 alone sends: the full state is gathered here, once, to rank 0's host RAM (the
        other ranks hold ``{}`` and send nothing), and its passes are not collective."""
        header = SyncHeader(version=self.policy.optimizer_steps, sender=self._rank)
        dtype, device = rollout_dtype(self.cfg), self.policy.device
        with self.policy.weights_on_device():  # offloaded (collocated): brought once for the probe (and the gather)
            if verify:
                ids, images, positions = self.policy.probe()
                header.probe_ids, header.probe_images, header.probe_positions = ids, images, positions
                header.probe_logits = self.policy.probe_logits(ids, images)
            if every_rank_sends:
                return header, lambda: self.policy.iter_hf_weights(dtype)
            state = self.policy.hf_state_dict(dtype)
        return header, lambda: ((n, t.to(device)) for n, t in state.items())

    def _hf_named(self):
        """The policy weights under HF names in the rollout's dtype, converted one unit at a time on this rank's
        device (offloaded weights are brought over tensor by tensor, never all at once)."""
        state = {
            k: v
            for k, v in self.policy.model.state_dict().items()
            if torch.is_tensor(v) and not k.endswith("._extra_state")
        }
        view = CastView(state, self.policy.device, rollout_dtype(self.cfg))
        return iter_megatron_to_hf({(0, 0): view}, self.policy.spec)

    def _hf_buckets(self, shared: bool):
        return pack_buckets(self._hf_named(), self._sync_bucket_bytes, shared=shared)

    # ------------------------------------------------------------------ logprobs and training
    def run_inference(self, input_channel, output_channel, compute_ref_logprobs: bool, num_results: int) -> None:
        """Recompute old (and reference) log-probs of exactly the trajectory ids, result by result.

        ``num_results`` is the step's total; each data-parallel rank takes its share (as RLinf's actor takes
        ``rollout_batch_size * group_size / DP`` sequences), whichever results reach it first."""
        with self.worker_timer():
            for _ in range(share_of(num_results, self.policy.dp)):
                res: AgentRolloutResult = input_channel.get()
                samples = samples_of([res])
                self.policy.recompute(samples, compute_ref=compute_ref_logprobs)
                res.recomputed_logprobs = pad_rows([s.old_logprobs for s in samples])
                if compute_ref_logprobs:
                    res.ref_logprobs = pad_rows([s.ref_logprobs for s in samples])
                output_channel.put(res)

    def run_training(self, input_channel, num_results: int, step: int):
        """Train on one rollout step. Returns ``(rollout_metrics, training_metrics_list)`` as RLinf does.

        Each data-parallel rank takes ``num_results / N`` results; which ones depends on arrival, the update
        does not (``data_parallel.shard_layout``: mini-batches follow the global uid order). Every rank returns
        the same global metrics (the runner reads rank 0's)."""
        with self.worker_timer():
            dp = self.policy.dp
            results = [input_channel.get() for _ in range(share_of(num_results, dp))]
            results.sort(key=lambda r: r.uid)  # arrival order varies; training order must not
            samples = samples_of(results)
            if self.cfg.runner.partial_rollout:  # a turn may span versions: the bound is on its oldest token
                check_token_bound(
                    step, [s.versions for s in samples], int(self.cfg.runner.max_staleness), [s.uid for s in samples]
                )
            if any(s.old_logprobs is None for s in samples):
                raise ValueError(
                    "run_training got results without recomputed_logprobs; run run_inference first "
                    "(algorithm.recompute_logprobs must be true)."
                )
            layout = shard_layout([r.uid for r in results], [r.num_sequence for r in results], dp)
            if self.critic is not None:
                return rollout_metrics(samples, dp), self._ppo_step(samples, step, layout)
            training = self.policy.train_step(samples, step, layout)
            return rollout_metrics(samples, dp), training

    def _ppo_step(self, samples: list[Sample], step: int, layout) -> list[dict[str, float]]:
        """PPO with the critic: values, GAE, the critic's update, then the policy's (none during
        ``critic.critic_warmup``). One metrics dict per mini-batch, the critic's ``critic/...`` beside the actor's."""
        from rlinf_ext.training.critic import assign_gae  # lazy: Megatron-core, in the actor's process only

        for smp, values in zip(samples, self.critic.compute_values(samples)):
            smp.values = values
        step_metrics = assign_gae(samples, self.critic_settings, self.policy.dp)
        critic = self.critic.train_values(samples, self.policy.minibatches(layout, step))
        self.critic.offload()  # critic.offload: the policy's update gets the GPU
        warmup = step < self.critic_settings.critic_warmup
        actor = [{} for _ in critic] if warmup else self.policy.train_step(samples, step, layout)
        return [{**a, **c, **step_metrics} for a, c in zip(actor, critic)]

    def compute_logprobs(self, prompt_ids, response_ids, response_masks, reference: bool = False) -> list[list[float]]:
        """Response log-probs of given sequences under the current policy (or the reference)."""
        samples = [Sample(p, r, m) for p, r, m in zip(prompt_ids, response_ids, response_masks)]
        return [lp.tolist() for lp in self.policy.compute_logprobs(samples, reference=reference)]

    def parameter_checksum(self) -> float:
        """Sum of |w| over all weights (cheap evidence that an update happened)."""
        return float(sum(p.detach().abs().sum() for p in self.policy.model.parameters()))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_path: str, step: int) -> None:
        """``save_path/iter_{step:07d}/mp_rank_00/model_optim_rng.pt`` + tracker (Megatron's layout, as RLinf
        saves with ``iteration=step``): mg2hf converts it as is. Called on every rank (the RNG states are
        gathered); data-parallel rank 0 writes."""
        with self.worker_timer():
            self.policy.save(save_path, iteration=step)
            if self.critic is not None:
                self.critic.save(critic_dir(save_path), iteration=step)

    def load_checkpoint(self, load_path: str) -> None:
        with self.worker_timer():
            self.policy.load(load_path)
            if self.critic is not None:
                if not os.path.isdir(critic_dir(load_path)):
                    raise FileNotFoundError(
                        f"critic.use_critic_model=true but the checkpoint has no critic: {critic_dir(load_path)} is "
                        "missing (a GRPO run's checkpoint?). Resume a PPO run's checkpoint, or start without "
                        "runner.resume_dir."
                    )
                iteration = self.critic.load(critic_dir(load_path))
                if self._rank == 0:
                    self.log_info(f"critic restored from {critic_dir(load_path)} (iteration {iteration})")
