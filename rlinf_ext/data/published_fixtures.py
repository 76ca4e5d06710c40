"""What the reference recipe downloads, generated offline at tiny size in the published formats (for its tiny run,
``examples/searchr1/reference_recipe.sh tiny``, and for the tests), from the tiny assets' questions and corpus.

The QA files:
- Search-R1's ``PeterJinGo/nq_hotpotqa_train``: ``train.parquet`` (NQ, then HotpotQA) and ONE merged
  ``test.parquet`` (the seven benchmarks one after the other, told apart by ``data_source``). Search-R1's
  ``scripts/data_process/qa_search_{train,test}_merge.py`` map FlashRAG rows (``id``, ``question``,
  ``golden_answers``) to ``data_source``, ``prompt`` = one user message, ``ability``, ``reward_model`` =
  ``{style, ground_truth: {target: [answers]}}`` and ``extra_info`` = ``{split, index}``, keep the FlashRAG columns
  and concatenate the sources: ``extra_info.index`` restarts at 0 in every source.
- RLinf's ``RLinf/Search-R1-Data`` ``train.jsonl``: one JSON object per line with the two fields its YAML reads
  (``data.prompt_key: prompt`` = the chat-formatted prompt, ``apply_chat_template: False``;
  ``data.answer_key: solutions`` = the gold answers).
The retrieval files (``e5_Flat.index``, ``wiki-18.jsonl.gz`` and its unpacked jsonl, ``models/e5-base-v2``) come from
``retrieval/published_fixtures.py``. ``write_tiny_download`` lays everything out as ``examples/searchr1/download.py``
does, plus the tiny policy model under ``models/``:

    python -m rlinf_ext.data.published_fixtures --work DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_ext.data.preprocess import question_from_prompt

TRAIN_SOURCES = ("nq", "hotpotqa")  # qa_search_train_merge.py --data_sources nq,hotpotqa, in that order
DATA_SUBDIR = "data/nq_hotpotqa_train"  # download.py's place for PeterJinGo/nq_hotpotqa_train
RLINF_DATA_SUBDIR = "data/Search-R1-Data"  # and for RLinf/Search-R1-Data
TINY_POLICY = "qwen2-tiny-sft-search"  # the tiny assets' warm start that searches (assets/searchr1/sft.py)


@dataclass(frozen=True)
class PublishedData:
    train_parquet: Path  # Search-R1's train.parquet
    test_parquet: Path  # Search-R1's merged test.parquet, seven data_sources
    rlinf_train_jsonl: Path  # RLinf's train.jsonl


def searchr1_schema():
    """The published column types, in the published order: FlashRAG's columns, then the ones process_fn adds."""
    import pyarrow as pa  # lazy: heavy

    strings = pa.list_(pa.string())
    return pa.schema(
        [
            ("id", pa.string()),
            ("question", pa.string()),
            ("golden_answers", strings),
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.struct([("target", strings)]))])),
            ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
        ]
    )


def published_row(row: dict, split: str, index: int) -> dict:
    """A Search-R1 row as published, from a tiny-asset Search-R1 row (the same prompt, answers and source)."""
    content = row["prompt"][0]["content"]
    answers = list(row["reward_model"]["ground_truth"]["target"])
    return {
        "id": f"{split}_{index}",  # FlashRAG's ids
        "question": question_from_prompt(content, "Question: "),
        "golden_answers": answers,
        "data_source": row["data_source"],
        "prompt": [{"role": "user", "content": content}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": split, "index": index},
    }


def merged_rows(rows_by_source: dict[str, list[dict]], sources, split: str) -> list[dict]:
    """The sources concatenated in order, each indexed from 0 (``datasets.map(..., with_indices=True)`` per source)."""
    return [published_row(row, split, i) for source in sources for i, row in enumerate(rows_by_source[source])]


def write_searchr1_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa  # lazy: heavy
    import pyarrow.parquet as pq  # lazy: heavy

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=searchr1_schema()), path)
    return path


def write_published_data(tiny: Any, work: Path) -> PublishedData:
    """``work/data/nq_hotpotqa_train/{train,test}.parquet`` and ``work/data/Search-R1-Data/train.jsonl`` from the tiny
    assets ``tiny`` (``assets.core.tiny.TinyAssets``: its Search-R1 train / per-benchmark test parquet, RLinf jsonl)."""
    import pyarrow.parquet as pq  # lazy: heavy

    train_rows = pq.read_table(tiny.searchr1_train).to_pylist()
    train_by_source = {s: [r for r in train_rows if r["data_source"] == s] for s in TRAIN_SOURCES}
    test_by_source = {b: pq.read_table(tiny.searchr1_test[b]).to_pylist() for b in tiny.benchmarks}
    rlinf = Path(work) / RLINF_DATA_SUBDIR / "train.jsonl"
    rlinf.parent.mkdir(parents=True, exist_ok=True)
    with open(tiny.rlinf_train) as src, open(rlinf, "w") as dst:
        for line in src:
            row = json.loads(line)
            dst.write(json.dumps({"prompt": row["prompt"], "solutions": row["solutions"]}) + "\n")
    data = Path(work) / DATA_SUBDIR
    return PublishedData(
        train_parquet=write_searchr1_parquet(
            merged_rows(train_by_source, TRAIN_SOURCES, "train"), data / "train.parquet"
        ),
        test_parquet=write_searchr1_parquet(
            merged_rows(test_by_source, tiny.benchmarks, "test"), data / "test.parquet"
        ),
        rlinf_train_jsonl=rlinf,
    )


def write_tiny_download(work: Path) -> dict[str, Path]:
    """Everything the reference recipe reads after its download, at tiny size, under ``work``; returns the paths."""
    from rlinf_ext.assets.core.cache import cached_tiny_assets  # lazy: the asset modules import transformers
    from rlinf_ext.assets.core.tiny import Parts  # lazy: the asset modules import transformers

    # lazy: faiss and transformers, only when the fixtures are written
    from rlinf_ext.retrieval.published_fixtures import make_published_retrieval

    work = Path(work)
    tiny = cached_tiny_assets(Parts.of(sft_search=True))  # read only: the cache entry is never written
    retrieval = make_published_retrieval(work, tiny.corpus_path, tiny.bert_encoder)
    data = write_published_data(tiny, work)
    policy = work / "models" / TINY_POLICY
    if policy.exists():
        shutil.rmtree(policy)
    shutil.copytree(tiny.qwen2_tiny_sft_search, policy)
    return {
        "flat_index": retrieval.flat_index,
        "corpus_gz": retrieval.corpus_gz,
        "corpus": retrieval.corpus,
        "encoder": retrieval.encoder,
        "train_parquet": data.train_parquet,
        "test_parquet": data.test_parquet,
        "rlinf_train_jsonl": data.rlinf_train_jsonl,
        "policy": policy,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write what the reference recipe downloads, at tiny size and in the "
        "published formats, offline, from the tiny assets (download.py's layout)."
    )
    parser.add_argument("--work", required=True, type=Path, help="Directory to write into (download.py's --save_path).")
    args = parser.parse_args(argv)
    for name, path in write_tiny_download(args.work).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
