"""RLinf worker around the Megatron-core policy, with the method names of RLinf's ``MegatronActor``.

``init_worker``, ``sync_model_to_rollout`` / ``del_reshard_state_dict``, ``run_inference`` (recompute old
and reference log-probs), ``run_training`` (returns ``(rollout_metrics, training_metrics_list)``),
``save_checkpoint`` / ``load_checkpoint``, and ``offload_engine`` / ``onload_engine``: on CUDA they move the
weights (``actor.offload_weight``: policy + reference) and the optimizer moments (``actor.offload_optimizer``)
to pinned CPU memory and back — the runner calls them only when the actor shares its GPUs with the rollout
(collocated); on CPU they are no-ops. Training and log-prob calls onload first if needed. Weights go to the
rollout in the rollout's dtype (``weight_sync.rollout_dtype``). A threaded (sync) actor, like RLinf's, so
calls run in submission order.
"""

from __future__ import annotations

from typing import Any

import torch
from rlinf.scheduler import Worker

from rlinf_ext.engines.actor import ActorSettings, MegatronPolicy, Sample
from rlinf_ext.engines.payloads import SearchRolloutResult, pad_rows
from rlinf_ext.engines.weight_sync import SyncPayload, probe_ids, rollout_dtype


def samples_of(results: list[SearchRolloutResult]) -> list[Sample]:
    """Flatten results (group order kept) into actor samples, with rewards and recomputed log-probs."""
    out = []
    for res in results:
        rewards = res.rewards.tolist() if torch.is_tensor(res.rewards) else list(res.rewards or [0.0] * res.num_sequence)
        for i in range(res.num_sequence):
            n = res.response_lengths[i]
            out.append(
                Sample(
                    prompt_ids=res.prompt_ids[i],
                    response_ids=res.response_ids[i],
                    response_mask=res.response_mask[i],
                    reward=float(rewards[i]),
                    old_logprobs=None if res.recomputed_logprobs is None else res.recomputed_logprobs[i, :n].clone(),
                    ref_logprobs=None if res.ref_logprobs is None else res.ref_logprobs[i, :n].clone(),
                )
            )
    return out


class MegatronActorWorker(Worker):
    """The policy trainer of one data-parallel rank (TP=PP=1 per process on CPU)."""

    def __init__(self, cfg: Any, total_train_steps: int):
        super().__init__()
        self.cfg = cfg
        self.settings = ActorSettings.from_config(cfg, total_train_steps)
        self.policy: MegatronPolicy | None = None
        self._sync_payload: SyncPayload | None = None
        self._rollout_ranks = 1  # set by the runner once the rollout group exists

    # ------------------------------------------------------------------ lifecycle
    def init_worker(self) -> None:
        with self.worker_timer():
            torch.set_num_threads(max(torch.get_num_threads(), 1))
            self.policy = MegatronPolicy(self.cfg.rollout.model.model_path, self.settings)
            self.log_info(
                f"actor ready on {self.policy.device}: {sum(p.numel() for p in self.policy.model.parameters()):,} params, "
                f"reference={'yes' if self.policy.ref_model is not None else 'no'}"
            )

    def offload_engine(self) -> None:
        """Give the GPU to the collocated rollout engine (no-op on CPU, see ``MegatronPolicy.offload``)."""
        with self.worker_timer():
            self.policy.offload(weights=bool(self.cfg.actor.offload_weight),
                                optimizer=bool(self.cfg.actor.offload_optimizer))

    def onload_engine(self) -> None:
        with self.worker_timer():
            self.policy.onload()

    # ------------------------------------------------------------------ weight sync (actor side)
    def sync_model_to_rollout(self, verify: bool = True) -> None:
        """Send the HF-named weights (+ probe logits when ``verify``) to every rollout rank."""
        with self.worker_timer():
            hf_state = self.policy.hf_state_dict(dtype=rollout_dtype(self.cfg))
            payload = SyncPayload(hf_state=hf_state, version=self.policy.optimizer_steps)
            if verify:
                ids = probe_ids(self.policy.model.hf_vocab_size)
                payload.probe_ids, payload.probe_logits = ids, self.policy.probe_logits(ids)
            self._sync_payload = payload
            if self._rank == 0:  # like RLinf: only the first data-parallel rank sends
                for dst in range(self._rollout_world_size()):
                    self.send(payload, self.cfg.rollout.group_name, dst)

    def _rollout_world_size(self) -> int:
        return int(self._rollout_ranks)

    def set_rollout_world_size(self, n: int) -> None:
        self._rollout_ranks = int(n)

    def del_reshard_state_dict(self) -> None:
        with self.worker_timer():
            self._sync_payload = None

    # ------------------------------------------------------------------ logprobs and training
    def run_inference(self, input_channel, output_channel, compute_ref_logprobs: bool, num_results: int) -> None:
        """Recompute old (and reference) log-probs of exactly the trajectory ids, result by result."""
        with self.worker_timer():
            for _ in range(num_results):
                res: SearchRolloutResult = input_channel.get()
                samples = samples_of([res])
                self.policy.recompute(samples, compute_ref=compute_ref_logprobs)
                res.recomputed_logprobs = pad_rows([s.old_logprobs for s in samples])
                if compute_ref_logprobs:
                    res.ref_logprobs = pad_rows([s.ref_logprobs for s in samples])
                output_channel.put(res)

    def run_training(self, input_channel, num_results: int, step: int):
        """Train on one rollout step. Returns ``(rollout_metrics, training_metrics_list)`` as RLinf does."""
        with self.worker_timer():
            results = [input_channel.get() for _ in range(num_results)]
            results.sort(key=lambda r: r.uid)  # arrival order varies; training order must not
            samples = samples_of(results)
            if any(s.old_logprobs is None for s in samples):
                raise ValueError("run_training got results without recomputed_logprobs; run run_inference first "
                                 "(algorithm.recompute_logprobs must be true).")
            training = self.policy.train_step(samples, step)
            rewards = torch.tensor([s.reward for s in samples])
            lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
            rollout_metrics = {
                "total_num_sequence": float(len(samples)),
                "reward_scores": float(rewards.mean()),
                "average_response_length": float(lengths.mean()),
                "max_of_response_length": float(lengths.max()),
                "min_of_response_length": float(lengths.min()),
                "prompt_length": float(sum(len(s.prompt_ids) for s in samples) / len(samples)),
                "loss_tokens": float(sum(sum(s.response_mask) for s in samples)),
            }
            return rollout_metrics, training

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
        saves with ``iteration=step``): mg2hf converts it as is."""
        with self.worker_timer():
            if self._rank == 0:
                self.policy.save(save_path, iteration=step)

    def load_checkpoint(self, load_path: str) -> None:
        with self.worker_timer():
            self.policy.load(load_path)
