"""The base asset generation (everything but the warm-started model), in dependency order."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from rlinf_ext.assets.core import corpus as corpus_mod
from rlinf_ext.assets.core import formats, models, tokenizer
from rlinf_ext.assets.core.search import LexicalRetriever
from rlinf_ext.assets.core.world import build_world
from rlinf_ext.assets.searchr1 import qa, rows, trajectories


def generate_base(root: Path, seed: int, log: Callable[..., None]) -> dict[str, float]:
    """Write corpus, QA files, tokenizer and random models under `root`; returns seconds per stage."""
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        timings[name] = round(now - t, 2)
        t = now

    world = build_world(seed)
    passages = corpus_mod.build_passages(world, seed)
    wiki = corpus_mod.wiki_rows(passages)
    pages = corpus_mod.page_rows(passages)
    formats.write_jsonl(wiki, root / "corpus" / "wiki.jsonl")
    formats.write_jsonl(pages, root / "corpus" / "pages.jsonl")
    splits = qa.split_questions(world, seed)
    log(f"corpus: {len(wiki)} passages, {len(pages)} pages -> {root / 'corpus'}")
    lap("corpus")

    # the tokenizer also learns from agent turns, so that think/search/answer text encodes compactly
    retriever = LexicalRetriever([r["contents"] for r in wiki])
    sample = [q for _, q in splits.train[:60]]
    turns = []
    for q in sample:
        segs = trajectories.trajectory_segments(q, trajectories.gold_observations(q, retriever))
        turns.append("".join(s.text for s in segs).replace(tokenizer.IM_END, ""))
    all_questions = [q.question for _, q in splits.train] + [q.question for qs in splits.test.values() for q in qs]
    texts = tokenizer.tokenizer_training_texts(
        [r["contents"] for r in wiki], all_questions, rows.searchr1_prompt(all_questions[0]), turns
    )
    tok = tokenizer.train_tokenizer(texts)
    tokenizer.save_tokenizer(tok, root / "tokenizer")
    log(f"tokenizer: {len(tok)} tokens -> {root / 'tokenizer'}")
    lap("tokenizer")

    train_sr1 = [rows.searchr1_row(q, src, "train", i) for i, (src, q) in enumerate(splits.train)]
    train_rl = [rows.rlinf_row(q, src, f"train-{i}", tok) for i, (src, q) in enumerate(splits.train)]
    formats.write_parquet(train_sr1, root / "data" / "searchr1" / "train.parquet")
    formats.write_jsonl(train_rl, root / "data" / "rlinf" / "train.jsonl")
    for bench, qs in splits.test.items():
        formats.write_parquet(
            [rows.searchr1_row(q, bench, "test", i) for i, q in enumerate(qs)],
            root / "data" / "searchr1" / "test" / f"{bench}.parquet",
        )
        formats.write_jsonl(
            [rows.rlinf_row(q, bench, f"test-{bench}-{i}", tok) for i, q in enumerate(qs)],
            root / "data" / "rlinf" / "test" / f"{bench}.jsonl",
        )
    log(f"qa: {len(train_sr1)} train questions, test {', '.join(f'{b}={len(v)}' for b, v in splits.test.items())}")
    lap("qa")

    tied = models.make_qwen2(tok, models.TinyQwen2Shape(), seed)
    models.save_hf_model(tied, tok, root / "models" / "qwen2-tiny")
    untied = models.make_qwen2(tok, models.TinyQwen2Shape(tie_word_embeddings=False), seed)
    models.save_hf_model(untied, tok, root / "models" / "qwen2-tiny-untied")
    wp = models.build_wordpiece([r["contents"] for r in wiki] + all_questions, root / "models" / "bert-tiny-encoder")
    bert = models.make_bert_encoder(wp, seed)
    models.save_hf_model(bert, wp, root / "models" / "bert-tiny-encoder")
    n_params = sum(p.numel() for p in tied.parameters())
    log(
        f"models: qwen2-tiny ({n_params:,} params, vocab {tied.config.vocab_size}), qwen2-tiny-untied, "
        f"bert-tiny-encoder (vocab {len(wp)}) -> {root / 'models'}"
    )
    lap("models")
    return timings
