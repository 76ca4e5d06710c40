"""Weight versions on the way from the engine's replies to the trainer's result: per token (the turn's version on
sampled ids, -1 on observation ids) beside the log-probs, in the Search-R1 loop, and their shapes in the result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest
import torch

from rlinf_ext.agent.core.response import OBSERVATION_VERSION, ResponseBuffer, check_mask_invariant
from rlinf_ext.agent.core.results import result_from_group, trajectory_records
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.generation import SamplingParams, reply_of, result_of
from rlinf_ext.runner.staleness import token_staleness_metrics
from tests.agent.searchr1.test_loop import CFG, PROMPT, TOK, RecordingSearch
from tests.support.scripted import ScriptedGenerator

SEARCH_THEN_ANSWER = ["<search> capital of france </search>", "<answer> Paris </answer>"]


@dataclass
class VersionedGenerator(ScriptedGenerator):
    """A scripted engine whose k-th reply was sampled by weight version ``versions[k]`` (None: an engine without)."""

    versions: list = field(default_factory=list)

    async def generate(self, prompt_ids, sampling_params):
        result = await super().generate(prompt_ids, sampling_params)
        return replace(result, weight_version=self.versions[len(self.calls) - 1])


def rollout(versions, script=SEARCH_THEN_ANSWER):
    gen = VersionedGenerator(script, versions=versions)
    return asyncio.run(
        run_trajectory(gen, TOK, PROMPT, ["Paris"], CFG, [RecordingSearch()], sampling_params=SamplingParams())
    )


def test_the_buffer_keeps_one_version_per_token_beside_the_logprobs():
    buf = ResponseBuffer()
    buf.add_sampled([11, 12, 13], [-0.1, -0.2, -0.3], 5)
    buf.add_observation([90, 91])
    buf.add_sampled([14], [-0.4], 6)
    assert buf.versions == [5, 5, 5, -1, -1, 6] and OBSERVATION_VERSION == -1
    assert buf.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4]
    assert buf.response_mask == [1, 1, 1, 0, 0, 1]
    buf.add_sampled([15], [-0.5], None)  # one turn from an engine without versions: the trajectory has none
    buf.add_observation([92])
    assert buf.versions is None and buf.logprobs is not None


def test_a_sync_between_the_loops_turns_splits_the_versions():
    traj = rollout([2, 3])
    first, second = traj.turns
    assert (first.weight_version, second.weight_version) == (2, 3)
    assert traj.rollout_versions == (
        [2] * len(first.response_ids) + [-1] * len(first.observation_ids) + [3] * len(second.response_ids)
    )
    assert len(traj.rollout_versions) == len(traj.rollout_logprobs) == len(traj.response_ids)
    check_mask_invariant(traj)


def test_the_mask_invariant_refuses_versions_that_do_not_follow_the_turns():
    traj = rollout([2, 3])
    with pytest.raises(AssertionError, match="version invariant"):
        check_mask_invariant(replace(traj, rollout_versions=[2] * len(traj.response_ids)))  # observations as sampled
    with pytest.raises(AssertionError, match="version invariant"):
        check_mask_invariant(replace(traj, rollout_versions=traj.rollout_versions[:-1]))
    with pytest.raises(AssertionError, match="log-prob invariant"):
        check_mask_invariant(replace(traj, rollout_logprobs=traj.rollout_logprobs + [0.0]))


def test_the_result_carries_versions_and_behaviour_logprobs_shaped_like_the_responses():
    a, b = rollout([2, 3]), rollout([4, 4], script=["<answer> Paris </answer>", "unused"])
    result = result_from_group([a, b])
    assert result.versions == [a.rollout_versions, b.rollout_versions]
    assert [len(v) for v in result.versions] == result.response_lengths == [len(a.response_ids), len(b.response_ids)]
    width = max(result.response_lengths)
    assert tuple(result.rollout_logprobs.shape) == (2, width) and result.rollout_logprobs.dtype == torch.float32
    for row, traj in zip(result.rollout_logprobs, (a, b)):
        n = len(traj.response_ids)
        assert row[:n].tolist() == pytest.approx(traj.rollout_logprobs) and not row[n:].any()
        assert all(row[i] == 0.0 for i, m in enumerate(traj.response_mask) if not m)  # observations: 0.0


def test_one_trajectory_without_versions_or_logprobs_leaves_the_group_without():
    a, b = rollout([2, 3]), rollout([None, None])
    assert b.rollout_versions is None and b.turns[0].weight_version is None
    result = result_from_group([a, b])
    assert result.versions == [] and result.rollout_logprobs is not None
    result = result_from_group([a, replace(a, rollout_logprobs=None)])
    assert result.rollout_logprobs is None and result.versions == [a.rollout_versions] * 2


@dataclass
class PreemptedVLLMGenerator(ScriptedGenerator):
    """A scripted engine whose replies come as vLLM 0.32's own final ``CompletionOutput`` with weight-version spans,
    read by ``vllm_wire.result_of_output`` and sent over the rollout's reply dict (``reply_of`` / ``result_of``).
    ``spans[k]``: the k-th reply's ``(end, label)`` pairs, ``end`` None = to the last token."""

    spans: list = field(default_factory=list)

    async def generate(self, prompt_ids, sampling_params):
        from vllm.outputs import CompletionOutput, WeightVersionSpan

        from rlinf_ext.generation.vllm_wire import result_of_output

        scripted = await super().generate(prompt_ids, sampling_params)
        ids, start, version_spans = scripted.output_ids, 0, []
        for end, label in self.spans[len(self.calls) - 1]:
            end = len(ids) if end is None else end
            version_spans.append(WeightVersionSpan(version=label, start=start, end=end))
            start = end
        finish = {"stop": ("stop", scripted.matched_stop), "eos": ("stop", None), "length": ("length", None)}
        reason, stop = finish[scripted.finish_reason]
        out = CompletionOutput(
            index=0,
            text="",
            token_ids=ids,
            cumulative_logprob=None,
            logprobs=None,
            finish_reason=reason,
            stop_reason=stop,
            weight_versions=version_spans,
        )
        result = result_of_output(out, self.tokenizer.decode, sampling_params, [self.tokenizer.eos_token_id])
        return result_of(reply_of(replace(result, logprobs=scripted.logprobs)))


def test_a_turn_sampled_by_two_versions_gives_its_tokens_each_their_own_and_counts_as_two_versions():
    """A sync landed while vLLM held the first turn preempted (issue 42): its first 3 tokens were sampled at version
    2, the rest at 3. The turn keeps both, token by token, into the records and the step's staleness metrics."""
    pytest.importorskip("vllm")
    spanned = asyncio.run(
        run_trajectory(
            PreemptedVLLMGenerator(SEARCH_THEN_ANSWER, spans=[[(3, "2"), (None, "3")], [(None, "3")]]),
            TOK,
            PROMPT,
            ["Paris"],
            CFG,
            [RecordingSearch()],
            sampling_params=SamplingParams(),
        )
    )
    first, second = spanned.turns
    # "<search> capital of france </search>" is 36 ids, "<answer> Paris </answer>" 24 (one id per character)
    assert (len(first.response_ids), len(second.response_ids)) == (36, 24)
    assert first.weight_version == [2, 2, 2] + [3] * 33 and second.weight_version == 3
    assert spanned.rollout_versions == [2, 2, 2] + [3] * 33 + [-1] * len(first.observation_ids) + [3] * 24
    check_mask_invariant(spanned)
    uniform = asyncio.run(
        run_trajectory(
            PreemptedVLLMGenerator(SEARCH_THEN_ANSWER, spans=[[(None, "3")], [(None, "3")]]),
            TOK,
            PROMPT,
            ["Paris"],
            CFG,
            [RecordingSearch()],
            sampling_params=SamplingParams(),
        )
    )
    result = result_from_group([spanned, uniform])
    assert [r["versions"] for r in trajectory_records(result)] == [spanned.rollout_versions, uniform.rollout_versions]
    # trained at version 3, k = 1: 3 of the 120 sampled tokens are 1 step stale; 1 of the 2 trajectories has two
    assert token_staleness_metrics(3, result.versions, 1) == {
        mk.token_staleness(0): 117 / 120,
        mk.token_staleness(1): 3 / 120,
        mk.TRAJECTORIES_TWO_VERSIONS: 1 / 2,
        mk.STALENESS_TOKEN_MAX: 1.0,
    }


def test_the_mask_invariant_follows_a_turns_per_token_versions():
    traj = asyncio.run(
        run_trajectory(
            VersionedGenerator(SEARCH_THEN_ANSWER, versions=[[2] * 10 + [3] * 26, 3]),
            TOK,
            PROMPT,
            ["Paris"],
            CFG,
            [RecordingSearch()],
            sampling_params=SamplingParams(),
        )
    )
    assert traj.rollout_versions[:36] == [2] * 10 + [3] * 26
    check_mask_invariant(traj)
    shifted = [2] * 11 + traj.rollout_versions[11:]  # one token credited to the wrong version
    with pytest.raises(AssertionError, match="version invariant"):
        check_mask_invariant(replace(traj, rollout_versions=shifted))
