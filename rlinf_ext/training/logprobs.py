"""Log-probs (and entropy) of the next tokens, computed chunk by chunk over the sequence.

A full-vocabulary fp32 ``log_softmax`` of a Search-R1 sequence is ``T x 151 936 x 4`` bytes (4.3 GB at 7k
tokens), held several times over by the backward. Here the decoder's hidden states ``[S, B, H]`` go through the
output layer ``chunk_tokens`` tokens at a time; each chunk's logits live only inside that chunk, and under
autograd the chunk is checkpointed (``torch.utils.checkpoint``, non-reentrant: autocast state is replayed), so
the backward recomputes one chunk's logits instead of keeping all of them. Only the hidden states and the
per-token results ``[B, S-1]`` stay alive. The values are those of the unchunked formula (the same rows of the
same matmul, fp32 ``log_softmax``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

Projection = Callable[[torch.Tensor], torch.Tensor]  # hidden [s, B, H] -> logits [s, B, V]


def _chunk_math(
    project: Projection, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = project(hidden).float()  # log-prob math in fp32
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(dim=-1) if with_entropy else picked.new_zeros(())
    return picked, entropy


def next_token_logprobs(
    project: Projection,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [B, S-1], entropy [B, S-1] or None)`` of token t+1 given tokens 0..t.

    ``hidden`` is the decoder output ``[S, B, H]`` (Megatron's sequence-first layout), ``input_ids`` ``[B, S]``.
    A chunk holds ``max(1, chunk_tokens // B)`` positions of every row."""
    if chunk_tokens < 1:
        raise ValueError(f"actor.logprob_chunk_tokens={chunk_tokens}; use a positive number of tokens.")
    seq, batch = hidden.shape[0], hidden.shape[1]
    targets = input_ids[:, 1:].transpose(0, 1)  # [S-1, B]
    step = max(1, chunk_tokens // max(batch, 1))
    checkpointed = torch.is_grad_enabled() and hidden.requires_grad
    picked, entropies = [], []
    for start in range(0, seq - 1, step):
        h = hidden[start : min(start + step, seq - 1)]
        t = targets[start : start + h.shape[0]]
        if checkpointed:
            lp, ent = checkpoint(_chunk_math, project, h, t, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_math(project, h, t, temperature, with_entropy)
        picked.append(lp)
        entropies.append(ent)
    logprobs = torch.cat(picked, dim=0).transpose(0, 1)
    entropy = torch.cat(entropies, dim=0).transpose(0, 1) if with_entropy else None
    return logprobs, entropy
