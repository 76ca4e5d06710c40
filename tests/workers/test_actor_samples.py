"""``workers/actor.py:samples_of``: the actor's samples carry what the rollout result holds, the engine's sampled
log-probs and weight versions included."""

from __future__ import annotations

import torch

from rlinf_ext.protocol.payloads import AgentRolloutResult, pad_rows
from rlinf_ext.training.grpo_policy import MMSample
from rlinf_ext.workers.actor import samples_of


def _result(**kw) -> AgentRolloutResult:
    # two trajectories of 3 and 2 response tokens; the first has an observation token (mask 0) in the middle
    return AgentRolloutResult(
        num_sequence=2,
        group_size=2,
        prompt_lengths=[2, 2],
        prompt_ids=[[5, 6], [5, 6]],
        response_lengths=[3, 2],
        response_ids=[[7, 8, 9], [7, 4]],
        response_mask=[[1, 0, 1], [1, 1]],
        is_end=[True, True],
        rewards=torch.tensor([1.0, 0.0]),
        recomputed_logprobs=pad_rows([torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-0.4, -0.5])]),
        uid="u",
        **kw,
    )


def test_engine_logprobs_and_versions_reach_the_samples():
    res = _result(rollout_logprobs=pad_rows([torch.tensor([-0.11, 0.0, -0.31]), torch.tensor([-0.41, -0.51])]))
    res.versions = [[3, -1, 4], [4, 4]]  # the field the rollout side adds: read when present
    samples = samples_of([res])
    assert torch.equal(samples[0].behaviour_logprobs, torch.tensor([-0.11, 0.0, -0.31]))
    assert torch.equal(samples[1].behaviour_logprobs, torch.tensor([-0.41, -0.51]))  # the padding is cut off
    assert samples[0].behaviour_logprobs.dtype == torch.float32
    assert [s.versions for s in samples] == [[3, -1, 4], [4, 4]]
    assert torch.equal(samples[1].old_logprobs, torch.tensor([-0.4, -0.5]))
    assert [s.uid for s in samples] == ["u#0", "u#1"]  # named in errors: the result's uid, the trajectory's index
    # RLinf's own type for the field, a list of lists, reads the same
    listed = samples_of([_result(rollout_logprobs=[[-0.11, 0.0, -0.31], [-0.41, -0.51]])])
    assert all(torch.equal(a.behaviour_logprobs, b.behaviour_logprobs) for a, b in zip(listed, samples))
    # the vision-language actor's samples (a result with images) carry them the same way
    mm = samples_of([_result(rollout_logprobs=res.rollout_logprobs, trajectory_images=[[], []])])
    assert all(isinstance(s, MMSample) for s in mm)
    assert all(torch.equal(a.behaviour_logprobs, b.behaviour_logprobs) for a, b in zip(mm, samples))


def test_without_engine_logprobs_the_samples_have_none():
    samples = samples_of([_result()])
    assert all(s.behaviour_logprobs is None and s.versions is None for s in samples)
    res = _result()
    res.versions = [[], []]  # an engine that stamps no version
    assert all(s.versions is None for s in samples_of([res]))
