"""Config rules of the MMSearch-R1 sections."""

from __future__ import annotations

from test_rules import assert_issue, issues_for


def test_mm_eval_configs_are_clean(reference_env):
    for name in ("tiny-mm-cpu-eval", "qwen2.5-vl-7b-eval"):
        by_key, result = issues_for(name, [])
        assert result.ok, [str(i) for i in result.issues]


def test_loop_reward_and_data_must_agree(reference_env):
    assert_issue("tiny-mm-cpu-eval", ["reward.reward_type=searchr1"], "reward.reward_type", "mmsearch")
    assert_issue("tiny-mm-cpu-eval", ["data.type=searchr1"], "data.type", "mmsearch")
    assert_issue("tiny-cpu-eval", ["agentloop.agent=mmsearch"], "reward.reward_type", "mmsearch")


def test_mm_scoring_pixels_cache_and_training(reference_env):
    assert_issue("tiny-mm-cpu-eval", ["reward.scoring=f1"], "reward.scoring", "em")
    assert_issue("tiny-mm-cpu-eval", ["data.image_min_pixels=100"], "data.image_min_pixels", "784")
    assert_issue("tiny-mm-cpu-eval", ["tools.image_search.thumbnail_max_pixels=1000"],
                 "tools.image_search.thumbnail_max_pixels", "3136")
    assert_issue("tiny-mm-cpu-eval", ["tools.image_search.cache_path=null"], "tools.image_search.cache_path", "cache")
    assert_issue("tiny-mm-cpu-eval", ["runner.task_type=reasoning", "data.train_data_paths=[x.parquet]"],
                 "runner.task_type", "reasoning_eval")
    by_key, _ = issues_for("tiny-mm-cpu-eval", ["tools.image_search.backend=dummy", "tools.image_search.cache_path=null"])
    assert "tools.image_search.cache_path" not in by_key
