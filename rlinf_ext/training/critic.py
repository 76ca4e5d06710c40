"""PPO's critic on Megatron-core: the policy's backbone with a scalar value head, in the actor's processes.

It reuses ``MegatronPolicy``'s construction, precision, DDP, optimizer, offload and checkpoint code, loading
``critic.model_path`` (default: the policy's checkpoint). ``value_head`` (hidden -> 1, a child of the Megatron model
so all of those carry it) replaces the frozen, unread vocabulary projection; it starts at N(0, 0.02) from the actor's
seed like an HF token-classification head (verl's critic, Search-R1's), so first values are near 0. Token j's value
is read from the hidden state before it (``training/batching.py``'s layout). It trains on the policy's mini-batches
with ``training/ppo_math.py``'s clipped value loss, one step each, on the actor's schedule at its own peak LR; the
inherited GRPO steps are unused. NOT GPU-verified."""

from __future__ import annotations

from typing import Sequence

import torch

from rlinf_ext.models.megatron import hidden_states_only
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.payloads import pad_rows
from rlinf_ext.training.batching import PackedBatch, response_scatter, response_slice
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.grpo_policy import Sample
from rlinf_ext.training.lr_schedule import lr_at
from rlinf_ext.training.megatron_policy import MegatronPolicy
from rlinf_ext.training.ppo_math import (
    add_moments,
    explained_variance_of,
    last_token_rewards,
    masked_gae,
    masked_moments,
    value_loss,
    whiten,
)
from rlinf_ext.training.settings import CriticSettings

HEAD_INIT_STD = 0.02  # transformers' initializer_range of Qwen2: what a token-classification head starts with
# the critic's metrics that are averages over a mini-batch's tokens (summed over micro-batches already weighted)
_SUMMED = (mk.CRITIC_VALUE_LOSS,)


class MegatronCritic(MegatronPolicy):
    """The value model of one data-parallel rank (built after the policy, on the same parallel state)."""

    def __init__(self, critic: CriticSettings):
        self.critic = critic
        super().__init__(critic.model_path, critic.train, init_distributed=False)

    def _build(self, mg_state: dict[str, torch.Tensor], trainable: bool, dtype: torch.dtype) -> torch.nn.Module:
        model = super()._build(mg_state, trainable, dtype)
        model.output_layer.requires_grad_(False)  # the vocabulary projection: never read by the values
        head = torch.nn.Linear(model.config.hidden_size, 1, dtype=dtype)
        with torch.no_grad():
            head.weight.normal_(0.0, HEAD_INIT_STD, generator=torch.Generator().manual_seed(self.settings.seed))
            head.bias.zero_()
        model.value_head = head.to(self.device).requires_grad_(trainable)
        return model

    # ------------------------------------------------------------------ values
    def _token_values(self, batch: PackedBatch) -> torch.Tensor:
        """``[B, T-1]`` fp32 values, column t = the value of the state after tokens 0..t (before token t+1)."""
        ids, pos, mask = self._inputs(self.model, batch)
        with self.amp.autocast():
            with hidden_states_only(self.model):
                hidden = self.model(ids, pos, mask)  # [S, B, H]
            values = self.model.value_head(hidden).squeeze(-1)  # [S, B]
        return values.float().transpose(0, 1)[:, :-1]

    @torch.no_grad()
    def compute_values(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """The value of each response token ``[len(response_ids)]`` (observation tokens included; the GAE skips them)."""
        self.onload()
        was_training = self.model.training
        self.model.eval()
        out: list[torch.Tensor] = []
        try:
            mbs = max(self.settings.micro_batch_size, 1)
            for i in range(0, len(samples), mbs):
                chunk = samples[i : i + mbs]
                batch = self._pack(chunk)
                resp = response_slice(self._token_values(batch).cpu(), batch)
                out.extend(resp[j, : len(s.response_ids)].clone() for j, s in enumerate(chunk))
        finally:
            self.model.train(was_training)
        return out

    # ------------------------------------------------------------------ training
    def train_values(self, samples: Sequence[Sample], minibatches: list[list[int]]) -> list[dict[str, float]]:
        """One optimizer step per mini-batch (``minibatches``: this rank's local indices, the policy's) on the clipped
        value loss against each sample's ``returns``, anchored at its ``values``; returns one ``critic/...`` metrics
        dict per mini-batch (global over the ranks)."""
        s = self.settings
        if any(x.values is None or x.returns is None for x in samples):
            raise ValueError("the critic trains on samples with values and returns: compute_values and the GAE first.")
        total_opt_steps = s.total_train_steps * s.n_minibatches
        results = []
        self.onload()
        self.model.train()
        for idx in minibatches:
            mb = [samples[i] for i in idx]
            num_tokens = self.dp.sum_float(float(sum(sum(x.response_mask) for x in mb)), self.device)
            self.step.zero_grad()
            sums: dict[str, float] = {}
            for k in range(0, len(mb), s.micro_batch_size):
                chunk = mb[k : k + s.micro_batch_size]
                batch = self._pack(chunk)
                mask = batch.loss_mask.to(self.device)
                old = response_scatter(pad_rows([c.values for c in chunk]), batch).to(self.device)
                ret = response_scatter(pad_rows([c.returns for c in chunk]), batch).to(self.device)
                loss, metrics = value_loss(
                    self._token_values(batch), old, ret, mask, self.critic.value_clip, num_tokens=num_tokens
                )
                self.step.scale_loss(loss).backward()
                weight = sum(sum(x.response_mask) for x in chunk) / max(num_tokens, 1.0)
                for key, val in metrics.items():
                    if key in (mk.CRITIC_VF_EXPLAINED_VAR, mk.CRITIC_VALUES_MEAN):
                        continue  # the step's, before the update: assign_gae
                    sums[key] = sums.get(key, 0.0) + (val if key in _SUMMED else val * weight)
            lr = lr_at(self.optimizer_steps, total_opt_steps, s.lr, s.lr_warmup_fraction, s.lr_decay_style, s.min_lr)
            result = self.step.step(lr)
            self.optimizer_steps += 1
            sums = {k: self.dp.sum_float(v, self.device) for k, v in sums.items()}  # each rank holds its share
            sums.update(
                {mk.prefixed(mk.CRITIC_PREFIX, "grad_norm"): result.grad_norm, mk.prefixed(mk.CRITIC_PREFIX, "lr"): lr}
            )
            results.append(sums)
        return results


def assign_gae(samples: Sequence[Sample], critic: CriticSettings, dp: DataParallel) -> dict[str, float]:
    """Set each sample's ``advantages`` (whitened over the whole step's generated tokens, every rank's) and
    ``returns`` from its reward and ``values``; returns the step's ``critic/vf_explained_var`` and
    ``critic/values_mean`` of those values (verl's, before the critic's update)."""
    raw, adv_parts, ret_parts, res_parts, val_parts = [], [], [], [], []
    for smp in samples:
        if smp.values is None:
            raise ValueError("assign_gae needs the critic's values on every sample (MegatronCritic.compute_values).")
        mask = torch.as_tensor(smp.response_mask, dtype=torch.float32)[None]
        values = smp.values.float()[None]
        adv, ret = masked_gae(
            last_token_rewards(torch.tensor([float(smp.reward)]), mask), values, mask, critic.gamma, critic.gae_lambda
        )
        smp.returns = ret[0]
        raw.append((adv, mask))
        adv_parts.append(masked_moments(adv, mask))
        ret_parts.append(masked_moments(ret, mask))
        res_parts.append(masked_moments(ret - values, mask))
        val_parts.append(masked_moments(values, mask))
    mine = tuple(add_moments(p) for p in (adv_parts, ret_parts, res_parts, val_parts))
    adv_m, ret_m, res_m, val_m = (add_moments(p) for p in zip(*dp.gather_objects(mine)))
    for smp, (adv, mask) in zip(samples, raw):
        smp.advantages = whiten(adv, mask, adv_m)[0]
    return {
        mk.CRITIC_VF_EXPLAINED_VAR: explained_variance_of(ret_m, res_m),
        mk.CRITIC_VALUES_MEAN: val_m[1] / max(val_m[0], 1.0),
    }
