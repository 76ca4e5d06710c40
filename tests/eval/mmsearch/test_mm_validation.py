"""MMSearch-R1 validation during training (``eval/mmsearch/validation.py``) on the shared pass (``eval/core``): the
metrics by FVQA category, computed by hand from made-up records; one generations file per pass, never resumed; the
validation questions' image-search cache; the sampled subset per data file."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from types import SimpleNamespace

import pytest
from transformers import PreTrainedTokenizerBase

from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.eval.core.validation import sample_items
from rlinf_ext.eval.mmsearch.records import GenerationRecord
from rlinf_ext.eval.mmsearch.validation import ValidationPass, validation_image_search, validation_metrics
from rlinf_ext.protocol import metric_keys as mk
from tests.support.signature_checks import checked_against


class _Tokenizer:
    """The processor's tokenizer: ``decode`` spelled as transformers' ``PreTrainedTokenizerBase.decode`` accepts."""

    @checked_against(PreTrainedTokenizerBase.decode)
    def decode(self, *args, **kwargs):
        return "x"


def _record(item_id: str, category: str, correct: bool, image: int, text: int, error: str | None = None):
    return GenerationRecord(
        benchmark="test",
        item_id=item_id,
        question="q",
        data_source="tinymm",
        category=category,
        golden_answers=["a"],
        scores={"correct": float(correct), "reward": 0.9 * correct},
        image_searches=image,
        text_searches=text,
        error=error,
    )


def test_metrics_by_category_by_hand():
    records = [
        _record("0", "search_free", True, 0, 0),
        _record("1", "search_free", False, 1, 0),
        _record("2", "search_required", True, 1, 1),
        _record("3", "search_required", False, 0, 0, "boom"),
    ]
    m = validation_metrics(records)
    assert m[mk.VAL_N] == 4 and m[mk.VAL_ERRORS] == 1
    assert m["val/all/accuracy"] == 0.5 and m["val/all/reward"] == pytest.approx(0.45)
    assert m["val/search_free/accuracy"] == 0.5 and m["val/search_free/search_ratio_image"] == 0.5
    assert m["val/search_required/search_ratio_mix"] == 0.5 and m["val/search_required/search_ratio_image"] == 0.0
    assert m["val/search_required/search_ratio_any"] == 0.5 and m["val/all/search_ratio_any"] == 0.5
    assert m["val/search_required/accuracy"] == 0.5  # 1 of 2 (the errored one is wrong)


def test_validation_cache_replaces_the_training_cache_only_when_set():
    train = ImageSearchToolConfig(cache_path="/c/train")
    assert validation_image_search(train) is train
    val = validation_image_search(dataclasses.replace(train, val_cache_path="/c/test"))
    assert val.cache_path == "/c/test" and val.topk == train.topk


def test_subset_per_data_file():
    items = [(bench, Task(f"{bench}{i}", "q", (), ("a",))) for bench in ("a", "b") for i in range(5)]
    chosen = sample_items(items, 2, seed=3, benchmark=lambda it: it[0])
    assert [b for b, _ in chosen].count("a") == 2 and [b for b, _ in chosen].count("b") == 2
    assert chosen == sample_items(items, 2, seed=3, benchmark=lambda it: it[0])
    assert chosen == [it for it in items if it in chosen]  # file order kept


def _trajectory(task: Task, correct: bool):
    turn = SimpleNamespace(
        action="answer",
        text="<answer>a</answer>",
        tool=None,
        query=None,
        titles=[],
        observation_images=[],
        tool_ok=None,
        observation_ids=[],
    )
    metrics = {
        "image_searches": 0,
        "text_searches": 0,
        "image_search_failures": 0,
        "text_search_failures": 0,
        "missing_images": 0,
    }
    reward = SimpleNamespace(
        answer="a", correct=correct, em=float(correct), subem=float(correct), format_score=1.0, score=float(correct)
    )
    return SimpleNamespace(turns=[turn], reward_details=reward, metrics=metrics, response_ids=[1], end_reason="answer")


@pytest.mark.timeout(60)
def test_each_pass_measures_the_current_policy_and_writes_its_own_file(tmp_path):
    """Two passes over the same questions: the second sees a changed policy (all correct) and is not resumed from
    the first's file; each pass's generations go to global_step_<N>/."""
    items = [
        ("test", Task(str(i), "q", (), ("a",), "search_free" if i % 2 else "search_required", "tinymm"))
        for i in range(4)
    ]
    policy = {"correct": lambda task: task.data_id == "0"}

    async def rollout(task):
        return _trajectory(task, policy["correct"](task))

    vp = ValidationPass.__new__(ValidationPass)  # without a model: the rollout function is the policy
    vp.cfg = SimpleNamespace(data=SimpleNamespace(val_rollout_batch_size=2, rollout_batch_size=2))
    vp.processor = SimpleNamespace(tokenizer=_Tokenizer())
    vp.items, vp.rollout, vp.out_dir, vp.show_progress, vp.table_md = items, rollout, tmp_path, False, ""
    first = asyncio.run(vp.arun(0))
    policy["correct"] = lambda task: True
    second = asyncio.run(vp.arun(2))
    assert first["val/all/accuracy"] == 0.25 and second["val/all/accuracy"] == 1.0
    assert first["val/search_required/accuracy"] == 0.5 and first["val/search_free/accuracy"] == 0.0
    for step in (0, 2):
        rows = [
            json.loads(line)
            for line in (tmp_path / f"global_step_{step}" / "generations.jsonl").read_text().splitlines()
        ]
        assert sorted(r["item_id"] for r in rows) == ["0", "1", "2", "3"]
    text = vp.summary(second)
    assert "search_free accuracy 1.000" in text and "over 4 questions (0 errors)" in text
    assert "| data source | category |" in text and "| tinymm | search_free | 2 |" in text
