"""Pack trajectories (prompt + interleaved response) into right-padded model inputs and back.

Layout: row i is ``prompt_i + response_i`` followed by padding. Per-token arrays of width ``T-1`` are
aligned on *predicted* tokens: column t holds the quantity for token t+1 (its log-prob given tokens
0..t). The response token j of row i therefore sits at column ``P_i - 1 + j``. ``loss_mask`` is 1 only at
response tokens the policy generated (``response_mask`` 1); prompt, observation and padding are 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, T] long
    position_ids: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T-1] float, aligned on predicted tokens
    prompt_lengths: list[int]
    response_lengths: list[int]

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return sum(self.prompt_lengths) + sum(self.response_lengths)


def pack_sequences(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    response_masks: Sequence[Sequence[int]],
    pad_id: int,
) -> PackedBatch:
    if not (len(prompt_ids) == len(response_ids) == len(response_masks)) or not prompt_ids:
        raise ValueError("pack_sequences needs equally many (non-zero) prompts, responses and response masks.")
    for i, (p, r, m) in enumerate(zip(prompt_ids, response_ids, response_masks)):
        if len(r) != len(m):
            raise ValueError(f"trajectory {i}: response_ids ({len(r)}) and response_mask ({len(m)}) differ in length.")
        if not p:
            raise ValueError(f"trajectory {i}: empty prompt; the first response token needs a context.")
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    b, t = len(lengths), max(lengths)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, max(t - 1, 1)), dtype=torch.float32)
    for i, (p, r, m) in enumerate(zip(prompt_ids, response_ids, response_masks)):
        input_ids[i, : lengths[i]] = torch.tensor(list(p) + list(r), dtype=torch.long)
        if r:
            loss_mask[i, len(p) - 1 : len(p) - 1 + len(r)] = torch.tensor(m, dtype=torch.float32)
    position_ids = torch.arange(t, dtype=torch.long).unsqueeze(0).expand(b, t).contiguous()
    return PackedBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        loss_mask=loss_mask,
        prompt_lengths=[len(p) for p in prompt_ids],
        response_lengths=[len(r) for r in response_ids],
    )


def response_slice(values: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """``[B, T-1]`` predicted-token values -> ``[B, Rmax]`` values of the response tokens (0-padded)."""
    rmax = max(max(batch.response_lengths), 1)
    out = torch.zeros((values.shape[0], rmax), dtype=values.dtype)
    for i, (p, r) in enumerate(zip(batch.prompt_lengths, batch.response_lengths)):
        out[i, :r] = values[i, p - 1 : p - 1 + r]
    return out


def response_scatter(values: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Inverse of ``response_slice``: ``[B, >=Rmax]`` response values -> ``[B, T-1]`` (0 elsewhere)."""
    out = torch.zeros_like(batch.loss_mask, dtype=values.dtype)
    for i, (p, r) in enumerate(zip(batch.prompt_lengths, batch.response_lengths)):
        out[i, p - 1 : p - 1 + r] = values[i, :r]
    return out


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: ``logits`` [B, T, V] (fp32 math) -> [B, T-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
