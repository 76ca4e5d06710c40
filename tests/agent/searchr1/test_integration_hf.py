"""Integration: the tiny Qwen2 model (transformers generate, engine stop strings) through the agent loop
against the real retrieval server (BM25 over the tiny corpus) on loopback.

The tiny model is random, so a logits processor (`ForcedActions`) scripts *which* tokens are sampled (open a
search, a known title as the query, close it; then answer); everything else is real: the HF engine stops on `</search>`
and `</answer>`, the HTTP client queries the server, the observation comes from the index.
"""

import asyncio
import json

import pytest

from rlinf_ext.agent.core.response import check_mask_invariant
from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_group
from rlinf_ext.generation.hf import HFGenerator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.rewards import searchr1_reward
from rlinf_ext.tools import SearchTool, SearchToolConfig, close_http_session
from rlinf_ext.tools.search import TextSearch
from tests.support.scripted import ForcedActions


@pytest.mark.timeout(240)
def test_tiny_model_searches_real_server_and_answers(tiny_assets, retrieval_url):
    row = json.loads(tiny_assets.rlinf_train.read_text().splitlines()[0])
    first_doc = json.loads(tiny_assets.corpus_path.read_text().splitlines()[0])
    title = first_doc["contents"].split("\n")[0].strip('"')

    generator = HFGenerator.from_pretrained(
        tiny_assets.qwen2_tiny, tiny_assets.tokenizer_dir, seed=0, return_logprobs=True, max_batch_size=4
    )
    tokenizer = generator.tokenizer
    script = ForcedActions(tokenizer, query=title, answer=title)
    prompt_ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
    generator.logits_processors = [script]

    agent_cfg = LoopSettings(max_turns=2, response_length_total=600, max_obs_length=200)
    search_cfg = SearchToolConfig(backend="local", server_addr=retrieval_url, topk=3, default_timeout=10)
    params = SamplingParams(max_new_tokens=40, temperature=1.0, stop=["<|im_end|>"])

    async def go():
        tool = SearchTool(search_cfg)
        try:
            return tool, await run_group(
                generator,
                tokenizer,
                prompt_ids,
                [title],
                agent_cfg,
                [TextSearch(tool)],
                group_size=3,
                sampling_params=params,
                uid="it",
                reward_fn=lambda t: searchr1_reward(t.response_text, t.answers).score,
            )
        finally:
            await close_http_session()

    tool, trajectories = asyncio.run(go())
    assert max(generator.batch_sizes) > 1  # the 3 concurrent trajectories shared model calls
    assert tool.stats.calls == 3 and tool.stats.failures == 0
    for traj in trajectories:
        assert [t.action for t in traj.turns] == ["search", "answer"], traj.response_text
        first, second = traj.turns
        # the engine stopped on the stop string: the last sampled token is the closing tag, nothing after
        assert first.finish_reason == "stop" and first.matched_stop == "</search>"
        assert first.response_ids[-1] == script.plans["search"][-1]
        assert second.matched_stop == "</answer>" and second.response_ids[-1] == script.plans["answer"][-1]
        assert first.tool == "search" and first.query == title
        observation = tokenizer.decode(first.observation_ids)
        assert f'Doc 1(Title: "{title}")' in observation  # BM25 put the titled passage first
        assert observation.rstrip("\n").endswith("</information>")
        check_mask_invariant(traj)
        assert [
            i for i, m in zip(traj.response_ids, traj.response_mask) if m
        ] == first.response_ids + second.response_ids
        assert len(traj.rollout_logprobs) == len(traj.response_ids)
        assert traj.reward == 1.0 and traj.end_reason == "answer"
