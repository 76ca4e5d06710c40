"""The RLinf adapter: request/response translation and one group through the worker's rollout method
(called on a stand-in `self`, since RLinf workers can only be constructed inside a launched group)."""

import asyncio
from types import SimpleNamespace

import torch

from rlinf_ext.agent import AgentLoopConfig, SamplingParams
from rlinf_ext.agent.rlinf_adapter import (
    SearchR1AgentLoopWorker,
    engine_sampling_params,
    generation_result_from_engine,
    trajectories_to_rollout_result,
)
from rlinf_ext.agent.scoring import trajectory_reward_fn
from rlinf_ext.agent.scripted import CharTokenizer, ScriptedGenerator
from rlinf_ext.rewards import RewardConfig
from rlinf_ext.tools import SearchTool, SearchToolConfig

TOK = CharTokenizer()
PARAMS = SamplingParams(max_new_tokens=50, stop=["</search>", "</answer>"])


def test_engine_request_carries_stop_strings():
    request = engine_sampling_params(PARAMS)
    assert request["stop"] == ["</search>", "</answer>"] and request["max_new_tokens"] == 50
    assert request["include_stop_str_in_output"] is True
    assert SamplingParams(**request) == PARAMS  # round trip: the rollout side rebuilds the dataclass


def test_engine_response_classification():
    ids = TOK.encode("<search> q </search>")
    r = generation_result_from_engine({"output_ids": ids, "finish_reason": "stop"}, PARAMS, TOK, {0})
    assert (r.finish_reason, r.matched_stop, r.output_ids) == ("stop", "</search>", ids)
    r = generation_result_from_engine({"output_ids": TOK.encode("abc<eos>"), "finish_reason": "stop"}, PARAMS, TOK, {0})
    assert r.finish_reason == "eos"
    r = generation_result_from_engine({"output_ids": TOK.encode("abc"), "finish_reason": {"type": "length"}},
                                      PARAMS, TOK, {0})
    assert r.finish_reason == "length"


class FakeChannel:
    def __init__(self):
        self.items = []

    def put(self, item, async_op=True):
        self.items.append(item)
        return SimpleNamespace(async_wait=lambda: asyncio.sleep(0))


def test_worker_group_rollout_builds_rollout_result():
    engine = ScriptedGenerator(lambda k, ctx: "<answer>Paris</answer>" if "<information>" in ctx
                               else "<search> france </search> junk after the stop")
    requests = []

    async def generate(prompt_ids, sampling_params=None, rollout_name=None):
        requests.append(sampling_params)
        params = SamplingParams(max_new_tokens=sampling_params["max_new_tokens"], stop=sampling_params["stop"])
        result = engine.emulate_engine(engine.script(0, TOK.decode(prompt_ids)), params)
        return {"output_ids": result.output_ids, "finish_reason": "stop", "logprobs": result.logprobs}

    fake_self = SimpleNamespace(
        generate=generate, tokenizer=TOK, eos_ids={0}, max_prompt_len=100, return_logprobs=True,
        cfg=SimpleNamespace(agentloop=AgentLoopConfig(max_turns=2, response_length_total=1000)),
        search_tool=SearchTool(SearchToolConfig(backend="dummy")),
        sampling_params=PARAMS, reward_fn=trajectory_reward_fn(RewardConfig()),
    )
    channel = FakeChannel()
    metrics = asyncio.run(SearchR1AgentLoopWorker.run_agentloop_rollout_group(
        fake_self, TOK.encode("Q: capital of France?"), ["Paris"], 3, channel))
    assert all("</search>" in r["stop"] for r in requests)
    (result,) = channel.items
    assert result.num_sequence == result.group_size == 3
    assert result.rewards.tolist() == [1.0, 1.0, 1.0] and all(result.is_end)
    assert metrics["agent/searches"] == 1.0
    for ids, mask in zip(result.response_ids, result.response_mask):
        assert len(ids) == len(mask) and 0 in mask and "junk" not in TOK.decode(ids)
    batch = result.to_actor_batch(data_seq_length=100, training_seq_length=1100, pad_token=0)
    # the actor's response mask is exactly our mask, placed after the left-padded prompt
    row_mask = batch["response_mask"][0, 100:100 + len(result.response_mask[0])]
    assert torch.equal(row_mask.long(), torch.tensor(result.response_mask[0]))


def test_rollout_result_without_rewards_or_logprobs():
    from rlinf_ext.agent.types import Trajectory

    t = Trajectory(uid="u", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 0], turns=[], response_text="",
                   answers=["a"], end_reason="max_turns")
    result = trajectories_to_rollout_result([t], return_logprobs=False)
    assert result.rewards is None and result.is_end == [False] and result.rollout_logprobs is None
