"""The GRPO policy on Megatron-core, in-process (the Ray worker in ``workers/actor.py`` wraps it).

It follows RLinf's ``MegatronActor`` step by step: weights come from the HF checkpoint through the
conversion mapping (``use_hf_ckpt``: HF -> Megatron at start), old and reference log-probs are recomputed
on exactly the trajectory ids (the reference copy is frozen), and one rollout batch gives
``algorithm.n_minibatches`` optimizer steps, each accumulated over micro-batches of
``actor.micro_batch_size`` with a token-mean loss, gradient clipping and the LR schedule.

Runs on CUDA when available and on CPU otherwise. ``actor.model.precision`` bf16/fp16 = mixed precision:
fp32 master weights stepped by the optimizer, forward/backward under autocast, a loss scaler for fp16, fp32
log-prob and loss math (``training/precision.py:MixedPrecision``); the CPU profile uses fp32 (CPU autocast is slow).
Collocated GPU runs move weights and optimizer state to pinned CPU memory between phases (``offload`` /
``onload``; no-ops on CPU). Data parallelism (several processes, TP=PP=1 each): ``training/data_parallel.py``.
What it reads from the config: ``training/settings.py:ActorSettings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from megatron.core import parallel_state

from rlinf_ext.convert.hf_files import HFReader
from rlinf_ext.convert.mapping import ConvertSpec
from rlinf_ext.convert.state_dicts import hf_to_megatron, megatron_to_hf
from rlinf_ext.models.cpu_shims import init_parallel_state
from rlinf_ext.models.megatron import build_gpt_model, causal_padding_mask, load_megatron_state_dict
from rlinf_ext.protocol.payloads import pad_rows
from rlinf_ext.training.batching import (
    PackedBatch,
    gather_logprobs,
    pack_sequences,
    response_scatter,
    response_slice,
)
from rlinf_ext.training.checkpoint import (
    capture_rng_state,
    load_actor_checkpoint,
    restore_rng_state,
    save_actor_checkpoint,
)
from rlinf_ext.training.data_parallel import DataParallel, ShardLayout, merge_minibatch_metrics
from rlinf_ext.training.lr_schedule import lr_at
from rlinf_ext.training.precision import (
    MixedPrecision,
    move_module_,
    move_optimizer_state_,
    release_device_memory,
)
from rlinf_ext.training.rl_math import compute_advantages, entropy_from_logits, grpo_actor_loss
from rlinf_ext.training.settings import ActorSettings

# Metrics already divided by the mini-batch token count: micro-batch values add up to the mini-batch mean.
_SUMMED_METRICS = ("loss", "policy_loss", "policy_loss_abs", "kl", "entropy")


@dataclass
class Sample:
    """One trajectory as the actor sees it (response = generated and observation ids, interleaved)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    reward: float = 0.0
    old_logprobs: torch.Tensor | None = None  # [len(response_ids)]
    ref_logprobs: torch.Tensor | None = None  # [len(response_ids)]


class MegatronPolicy:
    """Policy + frozen reference on Megatron-core (TP=PP=1 in this process), with its optimizer.

    One data-parallel rank when ``parallel_state`` was initialised for several processes before it is built
    (every rank holds the whole model; ``train_step`` sums token counts and gradients over the ranks)."""

    def __init__(self, hf_model_path: str | Path, settings: ActorSettings, *, init_distributed: bool = True):
        self.settings = settings
        self.hf_model_path = str(hf_model_path)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.amp = MixedPrecision(settings.precision, self.device, settings.loss_scale)
        self._weights_offloaded = self._optimizer_offloaded = False
        if init_distributed:
            if not parallel_state.model_parallel_is_initialized():
                init_parallel_state(1, 1, seed=settings.seed)
        # DP = the processes of an already initialised group (the Ray worker initialises it for N ranks)
        self.dp = DataParallel.from_parallel_state()
        torch.manual_seed(settings.seed)
        self.spec = ConvertSpec.from_hf_config(self.hf_model_path, te_layernorm_names=False)
        hf_state = HFReader(self.hf_model_path).read_all()
        mg_state = hf_to_megatron(hf_state, self.spec, tp=1, pp=1)[(0, 0)]
        del hf_state

        def build(trainable: bool):
            # The policy keeps fp32 parameters (the master copy); the frozen reference only runs forward
            # under autocast, so it is stored in the compute dtype (half the memory).
            dtype = torch.float32 if trainable else self.amp.compute_dtype
            model = build_gpt_model(self.hf_model_path, params_dtype=dtype, init_weights=False)
            load_megatron_state_dict(model, mg_state, source=f"HF checkpoint {self.hf_model_path}")
            model.to(self.device)
            model.requires_grad_(trainable)
            return model

        self.model = build(True)
        self.model.train()
        self.ref_model = None
        if settings.loss.kl_beta > 0:
            self.ref_model = build(False)  # frozen: never handed to the optimizer
            self.ref_model.eval()
        self.optimizer = self._make_optimizer()
        self.optimizer_steps = 0

    # ------------------------------------------------------------------ set-up helpers
    def _make_optimizer(self) -> torch.optim.Optimizer:
        s = self.settings
        decay = [p for n, p in self.model.named_parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.requires_grad and p.ndim < 2]
        groups = [
            {"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},  # Megatron: no decay on biases and norms
        ]
        if s.optimizer == "adam":
            return torch.optim.AdamW(groups, lr=s.lr, betas=(s.adam_beta1, s.adam_beta2), eps=s.adam_eps)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr)
        raise ValueError(f"actor.optim.optimizer={s.optimizer!r}; use 'adam' or 'sgd'.")

    @property
    def pad_id(self) -> int:
        return 0

    # ------------------------------------------------------------------ forward passes
    def _logits(self, model: torch.nn.Module, batch: PackedBatch, mixed: bool = True) -> torch.Tensor:
        """fp32 logits ``[B, T, V]``; the forward runs under autocast unless ``mixed=False`` or fp32."""
        ids = batch.input_ids.to(self.device)
        pos = batch.position_ids.to(self.device)
        b, t = ids.shape
        # Right padding: the causal mask alone keeps real tokens from seeing padding.
        mask = None if getattr(model, "uses_te_spec", False) else causal_padding_mask(None, t, b).to(self.device)
        with self.amp.autocast() if mixed else torch.autocast(self.device.type, enabled=False):
            logits = model(ids, pos, mask, runtime_gather_output=True)
        return logits[..., : model.hf_vocab_size].float()  # log-prob and loss math in fp32

    def _policy_logits(self, model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
        """Logits of the sampling distribution (divided by the rollout temperature) for log-probs and losses."""
        logits = self._logits(model, batch)
        return logits if self.settings.temperature == 1.0 else logits / self.settings.temperature

    def _pack(self, samples: Sequence[Sample]) -> PackedBatch:
        return pack_sequences(
            [s.prompt_ids for s in samples], [s.response_ids for s in samples], [s.response_mask for s in samples], self.pad_id
        )

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[Sample], reference: bool = False) -> list[torch.Tensor]:
        """Log-probs of each response token ``[len(response_ids)]`` under the policy (or the reference)."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise ValueError("reference log-probs requested but algorithm.kl_beta == 0 (no reference model kept).")
        self.onload()
        was_training = model.training
        model.eval()
        out: list[torch.Tensor] = []
        try:
            mbs = max(self.settings.logprob_micro_batch_size, 1)
            for i in range(0, len(samples), mbs):
                chunk = samples[i : i + mbs]
                batch = self._pack(chunk)
                lp = gather_logprobs(self._policy_logits(model, batch), batch.input_ids.to(self.device)).float().cpu()
                resp = response_slice(lp, batch)
                out.extend(resp[j, : len(s.response_ids)].clone() for j, s in enumerate(chunk))
        finally:
            model.train(was_training)
        return out

    def recompute(self, samples: Sequence[Sample], compute_ref: bool) -> None:
        """Fill ``old_logprobs`` (and ``ref_logprobs``) of every sample in place."""
        for s, lp in zip(samples, self.compute_logprobs(samples)):
            s.old_logprobs = lp
        if compute_ref:
            for s, lp in zip(samples, self.compute_logprobs(samples, reference=True)):
                s.ref_logprobs = lp

    # ------------------------------------------------------------------ training
    def advantages(self, samples: Sequence[Sample]) -> torch.Tensor:
        """One GRPO advantage per trajectory ``[N]`` (groups are ``group_size`` consecutive samples)."""
        rewards = torch.tensor([float(s.reward) for s in samples])
        ones = torch.ones(len(samples), 1)
        adv = compute_advantages(
            rewards, ones, self.settings.group_size, self.settings.adv_type, self.settings.advantage_mode
        )
        return adv[:, 0]

    def _micro_loss(self, chunk: Sequence[Sample], chunk_adv: torch.Tensor, num_tokens: float):
        s = self.settings
        batch = self._pack(chunk)
        logits = self._policy_logits(self.model, batch)
        ids = batch.input_ids.to(self.device)
        logprobs = gather_logprobs(logits, ids)
        mask = batch.loss_mask.to(self.device)
        for i, smp in enumerate(chunk):
            if smp.old_logprobs is None:
                raise ValueError("sample has no old_logprobs: run recompute() (algorithm.recompute_logprobs) first.")
        old = response_scatter(pad_rows([c.old_logprobs for c in chunk]), batch).to(self.device)
        ref = None
        if s.loss.kl_beta > 0:
            ref = response_scatter(pad_rows(_present([c.ref_logprobs for c in chunk])), batch).to(self.device)
        adv = (chunk_adv.to(self.device)[:, None] * mask).float()
        entropy = entropy_from_logits(logits[:, :-1]) if s.loss.entropy_bonus > 0 else None
        return grpo_actor_loss(logprobs, old, adv, mask, s.loss, ref_logprobs=ref, entropy=entropy, num_tokens=num_tokens)

    def train_step(self, samples: Sequence[Sample], step: int, layout: ShardLayout | None = None) -> list[dict[str, float]]:
        """One rollout step: ``n_minibatches`` optimizer steps; returns one metrics dict per mini-batch.

        With data parallelism (``self.dp.size > 1``) ``samples`` are this rank's share (whole GRPO groups) and
        ``layout`` places them in the step's global order: mini-batch m is the same global set of samples as in
        a one-process run; each rank back-propagates the part it holds, the loss-token count is summed over
        the ranks before the backward and the gradients after it. Metrics are global on every rank.
        """
        s = self.settings
        if layout is None:
            if self.dp.enabled:
                raise ValueError("train_step with data parallelism needs the ShardLayout of this rank's samples "
                                 "(data_parallel.shard_layout).")
            layout = ShardLayout(tuple(range(len(samples))), len(samples))
        if len(layout.global_index) != len(samples):
            raise ValueError(f"ShardLayout places {len(layout.global_index)} samples but {len(samples)} were given.")
        n = layout.global_size
        if n % s.n_minibatches:
            raise ValueError(f"{n} trajectories cannot be split into algorithm.n_minibatches={s.n_minibatches} equal parts.")
        adv = self.advantages(samples)  # groups are whole on every rank: local = global advantages
        order = list(range(n))
        if s.shuffle_rollout:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(s.seed + step)).tolist()
        local_pos = {g: i for i, g in enumerate(layout.global_index)}
        per_mb = n // s.n_minibatches
        total_opt_steps = s.total_train_steps * s.n_minibatches
        params = [p for p in self.model.parameters() if p.requires_grad]
        results = []
        self.onload()
        self.model.train()
        for m in range(s.n_minibatches):
            # this rank's part of global mini-batch m, in the global order
            idx = [local_pos[g] for g in order[m * per_mb : (m + 1) * per_mb] if g in local_pos]
            mb = [samples[i] for i in idx]
            mb_adv = adv[idx]
            # token-mean over the GLOBAL mini-batch: every rank divides by the same count
            num_tokens = self.dp.sum_float(float(sum(sum(x.response_mask) for x in mb)), self.device)
            self.optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            for k in range(0, len(mb), s.micro_batch_size):
                chunk = mb[k : k + s.micro_batch_size]
                loss, metrics = self._micro_loss(chunk, mb_adv[k : k + s.micro_batch_size], num_tokens)
                self.amp.backward(loss)  # fp16: scaled
                weight = sum(sum(x.response_mask) for x in chunk) / max(num_tokens, 1.0)
                for key, val in metrics.items():
                    sums[key] = sums.get(key, 0.0) + (val if key in _SUMMED_METRICS else val * weight)
            # before unscale: an fp16 overflow on any rank reaches all of them, so all skip the same steps
            self.dp.sum_gradients_(params)
            self.amp.unscale_(self.optimizer)  # clip and step on true gradients
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], s.clip_grad)
            lr = lr_at(self.optimizer_steps, total_opt_steps, s.lr, s.lr_warmup_fraction, s.lr_decay_style, s.min_lr)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            ok = bool(torch.isfinite(grad_norm))
            if ok:  # like Megatron: a non-finite gradient skips the update instead of poisoning the weights
                self.optimizer.step()
            self.amp.update()  # fp16: an overflow (skipped step) halves the dynamic scale
            self.optimizer_steps += 1
            sums, adv_stats = self._global_minibatch_metrics(sums, mb_adv)
            sums.update(
                {"grad_norm": float(grad_norm), "lr": lr, "update_success": float(ok), "num_tokens": num_tokens,
                 **adv_stats}
            )
            if self.amp.scaler.is_enabled():
                sums["loss_scale"] = self.amp.loss_scale()
            results.append(sums)
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients until the next step
        return results

    def _global_minibatch_metrics(self, sums: dict[str, float], mb_adv: torch.Tensor):
        """(loss metrics, advantage stats) of the global mini-batch (this rank's alone with one rank)."""
        if not self.dp.enabled:
            return sums, {"advantages_mean": float(mb_adv.mean()), "advantages_max": float(mb_adv.max()),
                          "advantages_min": float(mb_adv.min())}
        mine = (sums, float(mb_adv.sum()), len(mb_adv), [float(mb_adv.max())] if len(mb_adv) else [],
                [float(mb_adv.min())] if len(mb_adv) else [])
        everyone = self.dp.gather_objects(mine)
        count = sum(e[2] for e in everyone)
        return merge_minibatch_metrics([e[0] for e in everyone]), {
            "advantages_mean": sum(e[1] for e in everyone) / max(count, 1),
            "advantages_max": max(v for e in everyone for v in e[3]),
            "advantages_min": min(v for e in everyone for v in e[4]),
        }

    # ------------------------------------------------------------------ weights and checkpoints
    def megatron_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items() if torch.is_tensor(v)}

    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy weights under HF names (conversion mapping), for the rollout engine; floating-point
        tensors cast to ``dtype`` (the rollout's) when given, else the fp32 master weights."""
        state = {k: v for k, v in self.megatron_state_dict().items() if not k.endswith("._extra_state")}
        hf = megatron_to_hf({(0, 0): state}, self.spec)
        if dtype is not None:
            hf = {k: v.to(dtype) if v.is_floating_point() else v for k, v in hf.items()}
        return hf

    @torch.no_grad()
    def probe_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[1, L, V]`` of the fp32 master weights on the probe ``ids [1, L]`` (no autocast: the
        reference the rollout's logits are checked against after a weight sync)."""
        batch = pack_sequences([ids[0, :1].tolist()], [ids[0, 1:].tolist()], [[1] * (ids.shape[1] - 1)], 0)
        offloaded = self._weights_offloaded
        if offloaded:  # collocated: bring the weights for the probe only, then give the GPU back
            self._move_weights(self.device, reference=False)
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self._logits(self.model, batch, mixed=False).cpu()
        finally:
            self.model.train(was_training)
            if offloaded:
                self._move_weights(torch.device("cpu"), reference=False)
                release_device_memory(self.device)
        return logits

    # ------------------------------------------------------------------ offload (collocated GPU runs)
    def _move_weights(self, device: torch.device, reference: bool = True) -> None:
        pin = device.type == "cpu" and self.device.type == "cuda"
        for model in (self.model, self.ref_model if reference else None):
            if model is not None:
                move_module_(model, device, pin_memory=pin)

    def offload(self, weights: bool = True, optimizer: bool = True) -> None:
        """Move weights (policy + reference) and/or optimizer moments to pinned CPU memory and free the GPU
        cache. CPU actor: nothing to free, no-op."""
        if self.device.type != "cuda":
            return
        cpu = torch.device("cpu")
        if weights and not self._weights_offloaded:
            self._move_weights(cpu)
            self._weights_offloaded = True
        if optimizer and not self._optimizer_offloaded:
            move_optimizer_state_(self.optimizer, cpu, pin_memory=True)
            self._optimizer_offloaded = True
        release_device_memory(self.device)

    def onload(self) -> None:
        """Undo ``offload`` (no-op when nothing is offloaded)."""
        if self._weights_offloaded:
            self._move_weights(self.device)
            self._weights_offloaded = False
        if self._optimizer_offloaded:
            move_optimizer_state_(self.optimizer, self.device)
            self._optimizer_offloaded = False

    @property
    def offloaded(self) -> bool:
        return self._weights_offloaded or self._optimizer_offloaded

    def scheduler_state(self) -> dict[str, Any]:
        """The LR schedule position (Megatron's ``opt_param_scheduler`` entry; steps = optimizer steps)."""
        s = self.settings
        total = s.total_train_steps * s.n_minibatches
        return {
            "num_steps": self.optimizer_steps,
            "max_lr": s.lr,
            "min_lr": s.min_lr,
            "lr_warmup_steps": round(s.lr_warmup_fraction * total),
            "lr_decay_steps": total,
            "lr_decay_style": s.lr_decay_style,
        }

    def save(self, directory: str | Path, iteration: int) -> Path | None:
        """Megatron's legacy layout in ``directory`` (see ``training/checkpoint.py``); ``iteration`` = rollout step.

        Call it on every data-parallel rank: the RNG states are gathered (one per rank, as Megatron's
        ``rng_state`` list) and data-parallel rank 0 writes the file (the weights are the same on all ranks).
        Returns the checkpoint path on rank 0, None elsewhere."""
        rng_states = self.dp.gather_objects(capture_rng_state())
        if self.dp.rank != 0:
            return None
        return save_actor_checkpoint(
            directory,
            iteration,
            self.megatron_state_dict(),
            optimizer=self._optimizer_state(),
            opt_param_scheduler=self.scheduler_state(),
            rng_state=rng_states,  # a list per data-parallel rank, as Megatron
            meta={"hf_model_path": self.hf_model_path},
        )

    def _optimizer_state(self) -> dict[str, Any]:
        """torch optimizer state dict; fp16 adds ``grad_scaler`` (Megatron keeps it in the optimizer entry too)."""
        state = self.optimizer.state_dict()
        if self.amp.scaler.is_enabled():
            state = {**state, "grad_scaler": self.amp.scaler.state_dict()}
        return state

    def load(self, directory: str | Path) -> int:
        """Restore weights, optimizer, LR-schedule position and RNG; returns the checkpoint's iteration."""
        ckpt = load_actor_checkpoint(directory)
        load_megatron_state_dict(self.model, ckpt["model"], source=f"{directory} (iteration {ckpt['iteration']})")
        optim_state = dict(ckpt["optimizer"])
        scaler_state = optim_state.pop("grad_scaler", None)
        self.optimizer.load_state_dict(optim_state)  # moves state onto each parameter's device
        if scaler_state is not None and self.amp.scaler.is_enabled():
            self.amp.scaler.load_state_dict(scaler_state)
        self.optimizer_steps = int(ckpt["opt_param_scheduler"]["num_steps"])
        # this rank's RNG state; a checkpoint from fewer ranks gives its first one (Megatron's fallback)
        rng = ckpt["rng_state"]
        restore_rng_state(rng[self.dp.rank] if self.dp.rank < len(rng) else rng[0])
        return int(ckpt["iteration"])


def _present(rows: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    if any(r is None for r in rows):
        raise ValueError("missing log-probs for a sample (old or reference); recompute them before training.")
    return list(rows)
