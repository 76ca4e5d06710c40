"""Small retrieval assets in exactly the formats Search-R1 publishes, generated offline (for tests and for the tiny
run of the reference recipe).

- ``wiki-18.jsonl.gz``: gzip of jsonl rows ``{"id": "<row>", "contents": "\\"Title\\"\\ntext"}``, nothing else.
- ``e5_Flat.index``: ``faiss.write_index`` of an ``IndexFlatIP`` over the passages' e5 vectors, row i = passage i;
  optionally ``e5_HNSW64.index`` (``IndexHNSWFlat``, M=64, inner product) over the same vectors.
- ``models/e5-base-v2/``: the encoder folder (a copy of the given one, e.g. the tiny BERT encoder).

The passage vectors are computed here the way Search-R1's index builder does (``"passage: "`` prefix, masked mean
of the last hidden states, L2 normalisation, inner product), in code independent of ``retrieval/encoder.py``, so
that adopting these files checks the project's encoder against an index it did not make. The layout is the one
``examples/searchr1/download.py`` writes under ``--save_path``:

    python -m rlinf_ext.retrieval.published_fixtures --work DIR --corpus wiki.jsonl --encoder bert-tiny-encoder
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import unpack_gzip

# file names as published (PeterJinGo/wiki-18-e5-index, wiki-18-e5-index-HNSW64, wiki-18-corpus) and as
# download.py lays them out
FLAT_INDEX_NAME = "e5_Flat.index"
HNSW_INDEX_NAME = "e5_HNSW64.index"
HNSW_TYPE = "HNSW64"
CORPUS_GZ_NAME = "wiki-18.jsonl.gz"
ENCODER_SUBDIR = "models/e5-base-v2"
PASSAGE_PREFIX = "passage: "
MAX_LENGTH = 256  # Search-R1's build_index.sh


@dataclass(frozen=True)
class PublishedRetrieval:
    work: Path
    flat_index: Path
    corpus_gz: Path
    corpus: Path | None  # the unpacked jsonl when laid out as download.py leaves it
    encoder: Path
    hnsw_index: Path | None


def read_contents(corpus: str | Path) -> list[str]:
    """The ``contents`` of every row of a jsonl corpus (Search-R1 or ASearcher rows), in order."""
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["contents"] for line in f if line.strip()]


def write_wiki18_gz(contents: list[str], path: str | Path) -> Path:
    """``wiki-18.jsonl.gz``: one ``{"id": str(row), "contents": ...}`` per passage, gzip-compressed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row, text in enumerate(contents):
            f.write(json.dumps({"id": str(row), "contents": text}) + "\n")
    return path


def encode_like_searchr1(
    encoder: str | Path,
    texts: list[str],
    *,
    prefix: str = PASSAGE_PREFIX,
    max_length: int = MAX_LENGTH,
    batch_size: int = 64,
) -> np.ndarray:
    """Search-R1's e5 passage vectors: prefix, tokenise (pad, truncate), masked mean of the last hidden states, L2
    normalised; float32 (n, hidden)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    model = AutoModel.from_pretrained(str(encoder)).eval()
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                [prefix + t for t in texts[start : start + batch_size]],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).bool()
            mean = hidden.masked_fill(~mask, 0.0).sum(dim=1) / mask.sum(dim=1)
            chunks.append(torch.nn.functional.normalize(mean, dim=-1).float().numpy())
    return np.concatenate(chunks).astype(np.float32)


def write_bare_index(vectors: np.ndarray, path: str | Path, faiss_type: str = "Flat") -> Path:
    """``faiss.write_index`` of ``index_factory(dim, faiss_type, METRIC_INNER_PRODUCT)`` filled with ``vectors``."""
    import faiss

    index = faiss.index_factory(vectors.shape[1], faiss_type, faiss.METRIC_INNER_PRODUCT)
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(path))
    return path


def make_published_retrieval(
    work: str | Path, corpus: str | Path, encoder: str | Path, *, hnsw: bool = False, as_downloaded: bool = True
) -> PublishedRetrieval:
    """Write the published files for ``corpus`` (a jsonl with ``contents``) and ``encoder`` under ``work``.

    ``as_downloaded``: also unpack the corpus the way download.py does (``wiki-18.jsonl`` beside the .gz).
    """
    work = Path(work)
    contents = read_contents(corpus)
    corpus_gz = write_wiki18_gz(contents, work / CORPUS_GZ_NAME)
    encoder_dir = work / ENCODER_SUBDIR
    if encoder_dir.exists():
        shutil.rmtree(encoder_dir)
    shutil.copytree(encoder, encoder_dir)
    vectors = encode_like_searchr1(encoder_dir, contents)
    flat = write_bare_index(vectors, work / FLAT_INDEX_NAME)
    hnsw_path = write_bare_index(vectors, work / HNSW_INDEX_NAME, HNSW_TYPE) if hnsw else None
    plain = unpack_gzip(corpus_gz) if as_downloaded else None
    return PublishedRetrieval(
        work=work, flat_index=flat, corpus_gz=corpus_gz, corpus=plain, encoder=encoder_dir, hnsw_index=hnsw_path
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write Search-R1's published retrieval files (e5_Flat.index, "
        "wiki-18.jsonl.gz, models/e5-base-v2) for a small corpus, offline."
    )
    parser.add_argument("--work", required=True, help="Directory to write into (download.py's --save_path layout).")
    parser.add_argument(
        "--corpus",
        required=True,
        help="Source jsonl whose rows have 'contents' (e.g. the tiny assets' corpus/wiki.jsonl).",
    )
    parser.add_argument(
        "--encoder", required=True, help="Encoder directory (e.g. the tiny assets' models/bert-tiny-encoder)."
    )
    parser.add_argument("--hnsw", action="store_true", help="Also write e5_HNSW64.index.")
    args = parser.parse_args(argv)
    made = make_published_retrieval(args.work, args.corpus, args.encoder, hnsw=args.hnsw)
    for name in ("flat_index", "hnsw_index", "corpus_gz", "corpus", "encoder"):
        if getattr(made, name) is not None:
            print(f"{name}: {getattr(made, name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
