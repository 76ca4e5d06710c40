"""MMSearch-R1 results through the reward step (pure): turn texts reach the mmsearch reward, rows split by category."""

from __future__ import annotations

import pytest

from rlinf_ext.agent.mmsearch.metrics import reward_metrics, reward_rows
from rlinf_ext.agent.mmsearch.rollout import agent_metrics, group_result, result_records
from rlinf_ext.agent.mmsearch.types import VLTrajectory, VLTurnRecord
from rlinf_ext.config.schema import RewardConfig
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.protocol.images import ImageRef
from rlinf_ext.workers.reward import score_result_details

IMG = ImageRef("ab" * 20, b"png", 56, 56)
SEARCH = "<reason> look it up </reason><search><img></search>"
ANSWER = "<reason> it is red </reason><answer> red </answer>"


def _traj(turn_texts, image_searches, category):
    turns = [
        VLTurnRecord(prompt_ids=[1], response_ids=[2], observation_ids=[], text=t, action="answer") for t in turn_texts
    ]
    return VLTrajectory(
        uid="q1",
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 1],
        turns=turns,
        response_text="".join(turn_texts),
        answers=["red"],
        images=[IMG] * (1 + image_searches),
        category=category,
        metrics={
            "image_searches": float(image_searches),
            "text_searches": 0.0,
            "image_search_failures": 0.0,
            "text_search_failures": 0.0,
        },
    )


def test_turn_texts_and_categories_reach_the_reward_and_its_metrics():
    group = [_traj([ANSWER], 0, "search_free"), _traj([SEARCH, ANSWER], 1, "search_free")]
    result = group_result(group, "prompt")
    assert result.turn_texts == [[ANSWER], [SEARCH, ANSWER]] and result.categories == ["search_free"] * 2
    assert [len(i) for i in result.trajectory_images] == [1, 2] and result.num_searches == [0, 1]
    cfg = RewardConfig(scoring="em", search_penalty=0.1)
    rewards, em, details = score_result_details(result, cfg, agent_spec("mmsearch").load("reward"))
    assert rewards == pytest.approx([1.0, 0.9]) and em == [1.0, 1.0]  # a correct answer that searched: 1 - 0.1
    rows = reward_rows(result, details)
    assert [r["image_searches"] for r in rows] == [0.0, 1.0] and all(r["correct"] == 1.0 for r in rows)
    metrics = reward_metrics([(result, details)])
    assert metrics["rollout/search_free/search_ratio_image"] == pytest.approx(0.5)
    records = result_records(result)
    assert records[1]["image_sha1s"] == [IMG.sha1] * 2 and records[0]["category"] == "search_free"
    assert agent_metrics(group)["agent/image_searches"] == pytest.approx(0.5)
