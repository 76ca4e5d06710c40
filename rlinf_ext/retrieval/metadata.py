"""The small metadata file written next to every index, and the checks the server runs against it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

METADATA_NAME = "index_meta.json"
FORMAT_VERSION = 1


class IndexMismatchError(RuntimeError):
    """The index does not belong to the corpus / encoder the server was given."""


@dataclass
class IndexMetadata:
    retriever: str  # bm25 | e5 | bge
    corpus_path: str
    corpus_size: int
    corpus_checksum: str  # corpus.file_fingerprint: size + hash of head/tail 1 MiB (fast, not full-content)
    passages: int
    model: str | None = None  # dense: path of the encoder the passages were embedded with
    model_checksum: str | None = None  # dense: model_fingerprint(model)
    dim: int | None = None
    pooling: str | None = None  # mean | cls
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int | None = None
    faiss_type: str | None = None  # factory string, e.g. Flat, HNSW64, IVF4096,PQ64
    faiss_checksum: str | None = None  # dense: file_fingerprint of faiss.index (a truncated/swapped file is refused)
    # dense: faiss ParameterSpace settings the server applies (e.g. {"nprobe": 32, "k_factor_rf": 8}); chosen by
    # the build's audit so that recall@k against exact search reaches the target; overridable at serve time.
    search_params: dict = field(default_factory=dict)
    audit: dict | None = None  # dense: figures of the last audit (recall@k vs exact, latency, memory); see audit.py
    extra: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def save(self, index_dir: str | os.PathLike) -> Path:
        path = Path(index_dir) / METADATA_NAME
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, index_dir: str | os.PathLike) -> IndexMetadata:
        path = Path(index_dir) / METADATA_NAME
        if not path.is_file():
            raise IndexMismatchError(
                f"{path} not found: {index_dir} is not a finished index (an interrupted build leaves no "
                "metadata). Build it with `rlinf-ext build-index --corpus C --out DIR --retriever ...`."
            )
        data = json.loads(path.read_text())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def model_fingerprint(model_path: str | os.PathLike) -> str:
    """Hash of an encoder directory's config and tokenizer files plus the sizes of its weight files."""
    root = Path(model_path)
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        if path.suffix in (".json", ".txt", ".model"):
            digest.update(path.read_bytes())
        else:
            digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()


def check_matches(
    meta: IndexMetadata,
    *,
    corpus_checksum: str,
    passages: int,
    retriever: str | None = None,
    model_checksum: str | None = None,
    index_dir: str = "",
) -> None:
    """Raise IndexMismatchError naming every field where the index and the given corpus/encoder differ."""
    problems = []
    if meta.corpus_checksum != corpus_checksum:
        problems.append(
            f"corpus checksum differs: index built from {meta.corpus_path} ({meta.corpus_checksum}), "
            f"given corpus has {corpus_checksum}"
        )
    if meta.passages != passages:
        problems.append(f"passage count differs: index has {meta.passages}, given corpus has {passages}")
    if retriever is not None and retriever != meta.retriever:
        problems.append(f"retriever differs: index is '{meta.retriever}', server was asked for '{retriever}'")
    if model_checksum is not None and meta.model_checksum is not None and model_checksum != meta.model_checksum:
        problems.append(
            f"encoder differs: index embedded with {meta.model}, the given --model has other config/tokenizer/weights"
        )
    if problems:
        raise IndexMismatchError(
            f"index {index_dir} does not match what the server was given:\n  - "
            + "\n  - ".join(problems)
            + "\nPass the corpus/encoder the index was built from, or rebuild the index with build-index."
        )
