"""The GRPO policy steps every actor backend shares, free of any backend (the Ray worker in ``workers/actor.py``
wraps a backend's policy).

``GRPOPolicy`` holds the log-prob recompute on exactly the trajectory ids, the advantages, and the mini-batch loop
in the global order (``algorithm.n_minibatches`` optimizer steps per rollout batch, each accumulated over
micro-batches of ``actor.micro_batch_size`` with a token-mean loss, gradient clipping and the LR schedule);
``Sample`` is one trajectory as the actor sees it (``MMSample`` with its images). Backends: ``training/megatron_policy.py:MegatronPolicy``
(Megatron-core, the text model) and ``training/fsdp_policy.py:FSDPPolicy`` (the vision-language HF model, FSDP2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from rlinf_ext.protocol.images import ImageRef
from rlinf_ext.protocol.payloads import pad_rows
from rlinf_ext.training.batching import response_scatter, response_slice
from rlinf_ext.training.data_parallel import ShardLayout, merge_minibatch_metrics
from rlinf_ext.training.lr_schedule import lr_at
from rlinf_ext.training.rl_math import compute_advantages, grpo_actor_loss

# Metrics already divided by the mini-batch token count: micro-batch values add up to the mini-batch mean.
_SUMMED_METRICS = ("loss", "policy_loss", "policy_loss_abs", "kl", "entropy")


@dataclass
class Sample:
    """One trajectory as the actor sees it (response = generated and observation ids, interleaved)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    reward: float = 0.0
    old_logprobs: torch.Tensor | None = None  # [len(response_ids)]: the actor's recompute (the proximal policy)
    ref_logprobs: torch.Tensor | None = None  # [len(response_ids)]
    # the engine's sampled log-probs [len(response_ids)], 0.0 on observation tokens (None: the engine gave none)
    behaviour_logprobs: torch.Tensor | None = None
    versions: list[int] | None = None  # per response token: the weight version that sampled it, -1 on observations
    uid: str = ""  # the trajectory's name in errors: its result's uid and its index in the group ("uid#i")
    # gae (PPO with a critic, training/critic.py): per response token, 0 on observations; None with GRPO
    advantages: torch.Tensor | None = None  # whitened GAE advantages: the policy loss reads them instead of GRPO's
    values: torch.Tensor | None = None  # the critic's values at the start of the step (the value clip's anchor)
    returns: torch.Tensor | None = None  # the critic's targets


@dataclass
class MMSample(Sample):
    """A trajectory with its images, in order of appearance in prompt + response ids."""

    images: list[ImageRef] = field(default_factory=list)


class GRPOPolicy:
    """The GRPO steps shared by the actor backends: log-prob recompute, advantages and the mini-batch loop.

    A backend provides ``model``/``ref_model``, ``settings``, ``dp``, ``device``, ``step`` (``training/optimizer.py``
    interface: zero_grad, scale_loss, step(lr)), ``optimizer_steps``, ``onload()``, ``_pack(samples)`` and
    ``_token_logprobs(model, batch, with_entropy)`` -> ``([B, T-1] log-probs, entropy or None)``."""

    @property
    def optimizer(self):
        """The underlying optimizer (torch's on CPU, Megatron's on CUDA)."""
        return self.step.optimizer

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
                lp = self._token_logprobs(model, batch)[0].float().cpu()
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
        """One GRPO advantage per trajectory ``[N]`` (groups are ``group_size`` consecutive samples). With gae the
        samples carry per-token advantages, which the loss reads; this is then each trajectory's mean over its
        generated tokens, for the advantage metrics only."""
        if self.settings.adv_type == "gae":
            return torch.tensor([_token_mean_advantage(s) for s in samples])
        rewards = torch.tensor([float(s.reward) for s in samples])
        ones = torch.ones(len(samples), 1)
        adv = compute_advantages(
            rewards, ones, self.settings.group_size, self.settings.adv_type, self.settings.advantage_mode
        )
        return adv[:, 0]

    def _micro_loss(
        self, chunk: Sequence[Sample], chunk_adv: torch.Tensor, num_tokens: float, behaviour: bool | None = None
    ):
        """Loss and metrics of one micro-batch; ``behaviour`` (default: ``uses_behaviour(chunk)``) weights it by
        the engine's log-probs (decoupled PPO, ``algorithm.off_policy``)."""
        s = self.settings
        if any(smp.old_logprobs is None for smp in chunk):
            raise ValueError("sample has no old_logprobs: run recompute() (algorithm.recompute_logprobs) first.")
        if behaviour is None:
            behaviour = self.uses_behaviour(chunk)
        batch = self._pack(chunk)
        logprobs, entropy = self._token_logprobs(self.model, batch, with_entropy=s.loss.entropy_bonus > 0)
        mask = batch.loss_mask.to(self.device)
        old = response_scatter(pad_rows([c.old_logprobs for c in chunk]), batch).to(self.device)
        ref = behav = None
        if s.loss.kl_beta > 0:
            ref = response_scatter(pad_rows(_present([c.ref_logprobs for c in chunk])), batch).to(self.device)
        if behaviour:
            behav = response_scatter(pad_rows([c.behaviour_logprobs for c in chunk]), batch).to(self.device)
        if s.adv_type == "gae":  # per token (GAE), laid out like the log-probs
            adv = response_scatter(pad_rows(_present_advantages(chunk)), batch).to(self.device).float() * mask
        else:
            adv = (chunk_adv.to(self.device)[:, None] * mask).float()
        return grpo_actor_loss(
            logprobs,
            old,
            adv,
            mask,
            s.loss,
            ref_logprobs=ref,
            entropy=entropy,
            num_tokens=num_tokens,
            behaviour_logprobs=behav,
        )

    def uses_behaviour(self, samples: Sequence[Sample], global_size: int | None = None) -> bool:
        """Whether the step weights its loss by the engine's log-probs: ``algorithm.off_policy.behaviour_weight`` is
        not ``none`` and every sample (of every rank: ``global_size`` samples in all) carries them. None carry them
        when the engine returns none (``rollout.return_logprobs: false``): the loss is then the plain clipped one,
        except with ``behaviour_required`` (``runner.max_staleness > 0``), which refuses it. Some but not all is
        refused: a trajectory whose log-probs were lost would train with the wrong weight; so is a NaN or infinite
        one on a sampled token, naming the trajectory's uid (``_non_finite_behaviour``), on every rank at once."""
        if self.settings.loss.behaviour_weight == "none":
            return False
        have, non_finite = 0, None
        for smp in samples:
            if smp.behaviour_logprobs is None:
                continue
            if len(smp.behaviour_logprobs) != len(smp.response_ids):
                raise ValueError(
                    f"a trajectory has {len(smp.behaviour_logprobs)} engine log-probs for "
                    f"{len(smp.response_ids)} response tokens; they must line up one to one."
                )
            non_finite = non_finite or _non_finite_behaviour(smp)
            have += 1
        total = len(samples) if global_size is None else global_size
        refusing = int(non_finite is not None)
        if global_size is not None and self.dp.enabled:
            have = int(round(self.dp.sum_float(float(have), self.device)))
            # every rank refuses together: one raising alone would leave the others waiting in the step's collectives
            refusing = int(round(self.dp.sum_float(float(refusing), self.device)))
        if non_finite is not None:
            raise ValueError(non_finite)
        if refusing:
            raise ValueError(
                f"{refusing} other data-parallel rank(s) hold a trajectory with a non-finite engine "
                "log-prob on a sampled token; their error names it."
            )
        if have == 0 and total and self.settings.behaviour_required:
            raise ValueError(
                "no trajectory of the step has engine log-probs, but runner.max_staleness > 0 trains on samples of "
                f"older weights and algorithm.off_policy.behaviour_weight={self.settings.loss.behaviour_weight!r} "
                "corrects for that with them. Set rollout.return_logprobs=true (and check that the engine returns "
                "them)."
            )
        if have not in (0, total):
            raise ValueError(
                f"{total - have} of the step's {total} trajectories have no engine log-probs while the others have: "
                "algorithm.off_policy.behaviour_weight needs them on every trajectory (the agent loop drops them when "
                "they do not line up with the sampled tokens). Fix the engine's log-probs, or set "
                "algorithm.off_policy.behaviour_weight=none."
            )
        return have > 0

    def train_step(
        self, samples: Sequence[Sample], step: int, layout: ShardLayout | None = None
    ) -> list[dict[str, float]]:
        """One rollout step: ``n_minibatches`` optimizer steps; returns one metrics dict per mini-batch.

        With ``self.dp.size > 1``, ``samples`` are this rank's whole GRPO groups and ``layout`` their global order,
        so mini-batch m holds a one-process run's samples; loss-token counts are summed over ranks before the
        backward, gradients (Megatron's DDP) after it. Metrics are global on every rank.
        """
        s = self.settings
        layout = self._check_layout(samples, layout)
        adv = self.advantages(samples)  # groups are whole on every rank: local = global advantages
        behaviour = self.uses_behaviour(samples, layout.global_size)
        total_opt_steps = s.total_train_steps * s.n_minibatches
        results = []
        self.onload()
        self.model.train()
        for idx in self.minibatches(layout, step):
            mb, mb_adv = [samples[i] for i in idx], adv[idx]
            # token-mean over the GLOBAL mini-batch: every rank divides by the same count
            num_tokens = self.dp.sum_float(float(sum(sum(x.response_mask) for x in mb)), self.device)
            self.step.zero_grad()
            sums: dict[str, float] = {}
            for k in range(0, len(mb), s.micro_batch_size):
                chunk = mb[k : k + s.micro_batch_size]
                loss, metrics = self._micro_loss(chunk, mb_adv[k : k + s.micro_batch_size], num_tokens, behaviour)
                self.step.scale_loss(loss).backward()  # fp16: scaled; DDP accumulates into main_grad
                weight = sum(sum(x.response_mask) for x in chunk) / max(num_tokens, 1.0)
                for key, val in metrics.items():
                    sums[key] = sums.get(key, 0.0) + (val if key in _SUMMED_METRICS else val * weight)
            lr = lr_at(self.optimizer_steps, total_opt_steps, s.lr, s.lr_warmup_fraction, s.lr_decay_style, s.min_lr)
            result = self.step.step(lr)  # reduce over the ranks, unscale, clip, step (skipped if not finite)
            self.optimizer_steps += 1
            sums, adv_stats = self._global_minibatch_metrics(sums, mb_adv)
            sums.update(
                {
                    "grad_norm": result.grad_norm,
                    "lr": lr,
                    "update_success": float(result.ok),
                    "num_tokens": num_tokens,
                    **adv_stats,
                }
            )
            if result.loss_scale is not None:
                sums["loss_scale"] = result.loss_scale
            results.append(sums)
        return results

    def minibatches(self, layout: ShardLayout, step: int) -> list[list[int]]:
        """This rank's part of each of the step's ``n_minibatches`` global mini-batches (local indices, in the
        global order, shuffled by ``seed + step`` with ``algorithm.shuffle_rollout``): the critic trains on the same
        mini-batches as the policy."""
        s, n = self.settings, layout.global_size
        order = list(range(n))
        if s.shuffle_rollout:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(s.seed + step)).tolist()
        local_pos = {g: i for i, g in enumerate(layout.global_index)}
        per_mb = n // s.n_minibatches
        return [
            [local_pos[g] for g in order[m * per_mb : (m + 1) * per_mb] if g in local_pos]
            for m in range(s.n_minibatches)
        ]

    def _check_layout(self, samples: Sequence[Sample], layout: ShardLayout | None) -> ShardLayout:
        if layout is None:
            if self.dp.enabled:
                raise ValueError(
                    "train_step with data parallelism needs the ShardLayout of this rank's samples "
                    "(data_parallel.shard_layout)."
                )
            layout = ShardLayout(tuple(range(len(samples))), len(samples))
        if len(layout.global_index) != len(samples):
            raise ValueError(f"ShardLayout places {len(layout.global_index)} samples but {len(samples)} were given.")
        if layout.global_size % self.settings.n_minibatches:
            raise ValueError(
                f"{layout.global_size} trajectories cannot be split into algorithm.n_minibatches="
                f"{self.settings.n_minibatches} equal parts."
            )
        return layout

    def _global_minibatch_metrics(self, sums: dict[str, float], mb_adv: torch.Tensor):
        """(loss metrics, advantage stats) of the global mini-batch (this rank's alone with one rank)."""
        if not self.dp.enabled:
            return sums, {
                "advantages_mean": float(mb_adv.mean()),
                "advantages_max": float(mb_adv.max()),
                "advantages_min": float(mb_adv.min()),
            }
        mine = (
            sums,
            float(mb_adv.sum()),
            len(mb_adv),
            [float(mb_adv.max())] if len(mb_adv) else [],
            [float(mb_adv.min())] if len(mb_adv) else [],
        )
        everyone = self.dp.gather_objects(mine)
        count = sum(e[2] for e in everyone)
        return merge_minibatch_metrics([e[0] for e in everyone]), {
            "advantages_mean": sum(e[1] for e in everyone) / max(count, 1),
            "advantages_max": max(v for e in everyone for v in e[3]),
            "advantages_min": min(v for e in everyone for v in e[4]),
        }


def _non_finite_behaviour(smp: Sample) -> str | None:
    """Why a NaN or infinite engine log-prob on a sampled token is refused (None: there is none): w = exp(prox -
    behav) would make the loss NaN (NaN) or give the token the cap's weight (-inf) without a word. Observation
    tokens are not checked: the engine gave no log-prob there and the loss never reads them
    (``rl_math.behaviour_weights`` keeps 0)."""
    mask = torch.as_tensor(smp.response_mask, dtype=torch.bool)
    bad = (mask & ~torch.isfinite(smp.behaviour_logprobs)).nonzero().flatten().tolist()
    if not bad:
        return None
    pos = bad[0]
    return (
        f"trajectory {smp.uid or '(unnamed)'} has a non-finite engine log-prob ({float(smp.behaviour_logprobs[pos])}) "
        f"at response token {pos} (token id {smp.response_ids[pos]}), a sampled token ({len(bad)} such token(s) in "
        "all): its behaviour weight would be undefined. Find why the engine returned it (a sampled token must have a "
        "finite log-prob under rollout.return_logprobs), or set algorithm.off_policy.behaviour_weight=none to train "
        "without the engine's log-probs."
    )


def _present(rows: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    if any(r is None for r in rows):
        raise ValueError("missing log-probs for a sample (old or reference); recompute them before training.")
    return list(rows)


def _token_mean_advantage(smp: Sample) -> float:
    adv = _present_advantages([smp])[0]
    mask = torch.as_tensor(smp.response_mask, dtype=torch.float32)
    return float((adv.float() * mask).sum() / max(float(mask.sum()), 1.0))


def _present_advantages(rows: Sequence[Sample]) -> list[torch.Tensor]:
    if any(r.advantages is None or len(r.advantages) != len(r.response_ids) for r in rows):
        raise ValueError(
            "algorithm.adv_type=gae: a trajectory has no per-token advantages (or not one per response "
            "token); the actor worker computes them from the critic's values before training."
        )
    return [r.advantages for r in rows]
