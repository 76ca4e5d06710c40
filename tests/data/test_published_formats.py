"""The QA files as their publishers ship them (made offline by ``rlinf_ext/data/published_fixtures.py``): Search-R1's
train.parquet and ONE merged test.parquet, and RLinf's train.jsonl, each preprocessed as one file; evaluation and
validation group the merged test set by ``data_source``."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
from data_helpers import EXAMPLE_YAML, read_jsonl

from rlinf_ext.data.preprocess import preprocess_files
from rlinf_ext.data.prompt_config import load_prompt_config
from rlinf_ext.data.prompts import load_jsonl_prompts
from rlinf_ext.eval.core.validation import sample_items
from rlinf_ext.eval.searchr1.benchmarks import PAPER_ORDER
from rlinf_ext.eval.searchr1.dataset import load_eval_items


def render(tokenizer):
    return lambda messages: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_the_fixture_has_the_published_columns_and_seven_sources(published_data):
    test = pq.read_table(published_data.test_parquet)
    assert test.column_names == [
        "id",
        "question",
        "golden_answers",
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    ]
    rows = test.to_pylist()
    assert list(dict.fromkeys(r["data_source"] for r in rows)) == list(PAPER_ORDER)
    assert sum(r["extra_info"]["index"] == 0 for r in rows) == 7  # the index restarts in every source
    assert rows[0]["reward_model"]["ground_truth"]["target"] == rows[0]["golden_answers"]


def test_merged_test_parquet_becomes_one_jsonl_with_every_source(published_data, tiny_assets, tokenizer, tmp_path):
    out = tmp_path / "test.jsonl"
    report = preprocess_files(
        [published_data.test_parquet], out, load_prompt_config(EXAMPLE_YAML), tokenizer, show_progress=False
    )
    rows = read_jsonl(out)
    expected = {b: len(read_jsonl(tiny_assets.rlinf_test[b])) for b in PAPER_ORDER}
    assert dict(report.by_source) == expected and report.written == len(rows) == sum(expected.values())
    # FlashRAG ids and Search-R1 indexes repeat across sources: the uids stay unique, prefixed by the source
    assert len({r["uid"] for r in rows}) == len(rows) and rows[0]["uid"] == "nq-test_0"
    # the same prompts and answers, in the same order, as the per-benchmark RLinf files made from these questions
    for bench in PAPER_ORDER:
        mine = [(r["prompt"], r["solutions"]) for r in rows if r["data_source"] == bench]
        assert mine == [(r["prompt"], r["solutions"]) for r in read_jsonl(tiny_assets.rlinf_test[bench])], bench

    # evaluation groups the one file by data_source, seven benchmarks in the paper's order
    items = load_eval_items([str(out)], render(tokenizer))
    assert Counter(i.benchmark for i in items) == expected
    assert list(dict.fromkeys(i.benchmark for i in items)) == list(PAPER_ORDER)
    assert [i.benchmark for i in load_eval_items([str(out)], render(tokenizer), data_size=2)] == [
        b for b in PAPER_ORDER for _ in range(2)
    ]
    # validation draws its per-benchmark sample from the one file as from seven
    assert Counter(i.benchmark for i in sample_items(items, 3, seed=1234)) == {b: 3 for b in PAPER_ORDER}
    # and the published parquet itself is read the same way, without preprocessing
    raw = load_eval_items([str(published_data.test_parquet)], render(tokenizer))
    assert [(i.benchmark, i.prompt, i.golden_answers) for i in raw] == [
        (i.benchmark, i.prompt, i.golden_answers) for i in items
    ]


def test_train_parquet_becomes_one_jsonl_the_trainer_reads(published_data, tokenizer, tmp_path):
    out = tmp_path / "train.jsonl"
    report = preprocess_files(
        [published_data.train_parquet], out, load_prompt_config(EXAMPLE_YAML), tokenizer, show_progress=False
    )
    published = pq.read_table(published_data.train_parquet).to_pylist()
    assert dict(report.by_source) == dict(Counter(r["data_source"] for r in published)) == {"nq": 240, "hotpotqa": 160}
    prompts = load_jsonl_prompts([out])
    assert len(prompts) == len(published) and len({p["uid"] for p in prompts}) == len(published)
    assert [p["answers"] for p in prompts] == [r["golden_answers"] for r in published]


def test_rlinf_train_jsonl_is_read_as_published(published_data, tiny_assets, tokenizer, tmp_path):
    rlinf_rows = read_jsonl(published_data.rlinf_train_jsonl)
    assert set(rlinf_rows[0]) == {"prompt", "solutions"}
    # preprocessed: the question is recovered from the chat-formatted prompt and templated back to the same text
    out = tmp_path / "train.jsonl"
    report = preprocess_files(
        [published_data.rlinf_train_jsonl], out, load_prompt_config(EXAMPLE_YAML), tokenizer, show_progress=False
    )
    rows = read_jsonl(out)
    assert report.written == len(rlinf_rows) and [r["prompt"] for r in rows] == [r["prompt"] for r in rlinf_rows]
    assert [r["solutions"] for r in rows] == [r["solutions"] for r in rlinf_rows]
    assert len({r["uid"] for r in rows}) == len(rows)
    # or read as it is by the trainer (RLinf's data.prompt_key / answer_key), with a uid per row
    prompts = load_jsonl_prompts([published_data.rlinf_train_jsonl])
    assert [p["prompt"] for p in prompts] == [r["prompt"] for r in rlinf_rows]
    assert len({p["uid"] for p in prompts}) == len(rlinf_rows)
