"""Fixtures for the retrieval tests: the tiny corpus/pages/encoder and indexes built once per session.

The corpus, pages and random BERT encoder come from the repo's tiny assets (docs/contracts.md, "Data and tiny assets") when the
generator is available; until then (and only then) an equivalent small set is generated here, offline.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class RetrievalAssets:
    corpus: Path
    pages: Path
    encoder: Path


def _make_fallback_assets(root: Path) -> RetrievalAssets:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)] + ["paris", "france", "capital", "river", "mountain", "king"]
    corpus, pages = root / "corpus" / "wiki.jsonl", root / "corpus" / "pages.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    with open(corpus, "w") as fc, open(pages, "w") as fp:
        for i in range(300):
            title = f"Topic {i}"
            text = " ".join(rng.choices(words, k=rng.randint(8, 40)))
            url = f"https://en.wikipedia.org/wiki/Topic_{i}"
            fc.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}', "url": url}) + "\n")
            if i % 3 == 0:
                fp.write(json.dumps({"url": url, "title": title, "contents": text}) + "\n")
    enc = root / "models" / "bert-tiny-encoder"
    enc.mkdir(parents=True, exist_ok=True)
    vocab = (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", ":", "passage", '"', "topic"]
        + words
        + [str(i) for i in range(10)]
        + list("abcdefghijklmnopqrstuvwxyz")
    )
    (enc / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    # transformers 5: the vocabulary is `vocab` (a `vocab_file` argument is ignored: a 5-token vocabulary)
    BertTokenizerFast(vocab={t: i for i, t in enumerate(dict.fromkeys(vocab))}).save_pretrained(enc)
    import torch

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(dict.fromkeys(vocab)),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(enc)
    return RetrievalAssets(corpus=corpus, pages=pages, encoder=enc)


@pytest.fixture(scope="session")
def retrieval_assets(request, tmp_path_factory) -> RetrievalAssets:
    try:
        import rlinf_ext.assets.core.tiny  # noqa: F401
    except ImportError:
        return _make_fallback_assets(tmp_path_factory.mktemp("retrieval_assets"))
    tiny = request.getfixturevalue("tiny_assets")
    return RetrievalAssets(corpus=tiny.corpus_path, pages=tiny.pages_path, encoder=tiny.bert_encoder)


@pytest.fixture(scope="session")
def bm25_index(retrieval_assets, tmp_path_factory) -> Path:
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig

    out = tmp_path_factory.mktemp("bm25_index")
    build_index(BuildConfig(corpus=str(retrieval_assets.corpus), out=str(out), retriever="bm25"))
    return out


@pytest.fixture(scope="session")
def dense_index(retrieval_assets, tmp_path_factory) -> Path:
    return build_e5(retrieval_assets, tmp_path_factory.mktemp("dense_index"))


@pytest.fixture(scope="session")
def dense_embeddings(retrieval_assets, tmp_path_factory) -> Path:
    """A directory holding the tiny corpus's finished embedding memmap (+ progress record) for the e5 spec."""
    return build_e5(retrieval_assets, tmp_path_factory.mktemp("dense_embeddings"), keep_embeddings=True)


def build_e5(retrieval_assets, out: Path, keep_embeddings: bool = False) -> Path:
    """The tiny corpus's e5 index (one CPU thread, batches of 16) built into ``out``."""
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig

    build_index(
        BuildConfig(
            corpus=str(retrieval_assets.corpus),
            out=str(out),
            retriever="e5",
            model=str(retrieval_assets.encoder),
            batch_size=16,
            device="cpu",
            threads=1,
            keep_embeddings=keep_embeddings,
        )
    )
    return out


@pytest.fixture(scope="session")
def build_dense_variant(retrieval_assets, dense_embeddings, tmp_path_factory):
    """``build(faiss_type, audit_sample=0) -> index dir``: dense indexes of other types over the same embeddings
    (the build resumes from a copy of the finished memmap, so nothing is encoded again); cached per arguments."""
    import shutil

    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.dense import EMBEDDINGS_NAME, PROGRESS_NAME

    built: dict = {}

    def build(faiss_type: str, audit_sample: int = 0) -> Path:
        key = (faiss_type, audit_sample)
        if key not in built:
            out = tmp_path_factory.mktemp("dense_variant")
            for name in (EMBEDDINGS_NAME, PROGRESS_NAME):
                shutil.copy(dense_embeddings / name, out / name)
            build_index(
                BuildConfig(
                    corpus=str(retrieval_assets.corpus),
                    out=str(out),
                    retriever="e5",
                    model=str(retrieval_assets.encoder),
                    faiss_type=faiss_type,
                    device="cpu",
                    threads=1,
                    audit_sample=audit_sample,
                )
            )
            built[key] = out
        return built[key]

    return build


@pytest.fixture(scope="session")
def published_retrieval(retrieval_assets, tmp_path_factory):
    """Search-R1's published retrieval files for the tiny corpus, as download.py lays them out: e5_Flat.index and
    e5_HNSW64.index (faiss.write_index, inner product), wiki-18.jsonl.gz (and its unpacked copy), models/e5-base-v2."""
    from rlinf_ext.retrieval.published_fixtures import make_published_retrieval

    return make_published_retrieval(
        tmp_path_factory.mktemp("published"), retrieval_assets.corpus, retrieval_assets.encoder, hnsw=True
    )
