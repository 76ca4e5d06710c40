"""The unchunked entropy the actor's chunked entropy is checked against (tests only): the whole ``[..., V]``
logits in fp32. (The log-prob twin, ``training/batching.py:gather_logprobs``, is the package's: the GPU smoke
script's HF reference uses it too.)"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` [..., V]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
