"""The post-sync probe check, shared by every rollout engine: the actor sends its logits on a probe prompt with
the sync's header (``sync/weight_sync.py:SyncHeader``); the rollout worker asks its engine for the same prompt's
log-probs after loading the weights, and ``probe_logprob_gap`` compares the two."""

from __future__ import annotations

import torch

from rlinf_ext.sync.weight_sync import WeightSyncError

# Mean |engine - actor| log-prob (nats) a sync may leave on the probe, by the rollout's precision: fp32 on both
# sides differs by summation order only (~1e-6); a 16-bit engine against the actor's fp32 logits differs by
# rounding (~0.01-0.1 nats); a wrong mapping or a partial load differs by nats
FP32_PROBE_ATOL = 1e-3
HALF_PROBE_ATOL = 0.5


def probe_atol(precision: str) -> float:
    """The probe's tolerance for an engine running in ``precision`` (``rollout.model.precision``: fp32, bf16, fp16)."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"rollout.model.precision {precision!r}: expected fp32, bf16 or fp16")
    return FP32_PROBE_ATOL if precision == "fp32" else HALF_PROBE_ATOL


def probe_logprob_gap(
    probe_ids: torch.Tensor, actor_logits: torch.Tensor, input_token_logprobs: list, positions: list[int] | None = None
) -> float:
    """Mean |engine - actor| log-prob of the probe's tokens 1..L-1 (pure); ``positions``: only those tokens (the
    multimodal probe compares the text after its image).

    ``actor_logits`` [1, L, V] from the ``SyncHeader``; ``input_token_logprobs``: the engine's log-prob of every
    probe token given the ones before, as SGLang's ``meta_info["input_token_logprobs"]`` with
    ``logprob_start_len=0`` (entries ``(logprob, token_id, text)``, the first one ``None``: no context; vLLM's
    generators return the same entries, ``generation/vllm_engine.py:VLLMGenerator.prompt_logprobs``).
    """
    ids = probe_ids.reshape(-1)
    values = [entry[0] for entry in input_token_logprobs]
    if values and values[0] is None:
        values = values[1:]
    if len(values) != len(ids) - 1 or any(v is None for v in values):
        raise WeightSyncError(
            f"the engine returned {len(values)} probe log-probs for {len(ids) - 1} positions; cannot check the sync."
        )
    expected = torch.log_softmax(actor_logits.reshape(len(ids), -1)[:-1].float(), dim=-1)
    expected = expected.gather(-1, ids[1:, None]).squeeze(-1)
    gaps = (expected - torch.tensor(values, dtype=torch.float32)).abs()  # entry j: token j + 1
    if positions is not None:
        gaps = gaps[torch.tensor([p - 1 for p in positions if p >= 1], dtype=torch.long)]
    return float(gaps.mean())
