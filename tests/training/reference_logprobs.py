"""The unchunked references the actor's chunked log-prob and entropy code is checked against (tests only): the
whole ``[B, T, V]`` logits in fp32, ``log_softmax``, gather."""

from __future__ import annotations

import torch


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: ``logits`` [B, T, V] (fp32 math) -> [B, T-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` [..., V]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
