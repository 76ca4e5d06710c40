"""An encoder named by a Hugging Face hub id: resolved to its local snapshot (huggingface_hub's own cache, offline
here) before anything needs a directory; a missing one is refused naming the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_ext.retrieval.hub import EncoderNotFoundError, is_hub_id, resolve_model_dir
from rlinf_ext.retrieval.metadata import IndexMetadata, model_fingerprint

REPO = Path(__file__).resolve().parents[2]
HUB_ID = "tiny-org/bert-tiny-encoder"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root: Path, encoder: Path) -> Path:
    """huggingface_hub's cache layout holding ``HUB_ID`` at ``COMMIT`` (refs/main -> snapshots/COMMIT/files)."""
    repo = root / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(encoder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_is_hub_id_hand_cases():
    assert is_hub_id("intfloat/e5-base-v2") and is_hub_id("BAAI/bge-base-en-v1.5")
    assert not is_hub_id("/models/e5") and not is_hub_id("./e5") and not is_hub_id("e5") and not is_hub_id("a/b/c")


def test_resolve_model_dir_keeps_directories_and_names_the_fix_otherwise(retrieval_assets, tmp_path, monkeypatch):
    import huggingface_hub

    assert resolve_model_dir(retrieval_assets.encoder) == retrieval_assets.encoder
    with pytest.raises(EncoderNotFoundError, match="is a file; pass the encoder's directory"):
        resolve_model_dir(retrieval_assets.encoder / "config.json")
    with pytest.raises(EncoderNotFoundError, match="no such directory, and not a hub id .*download.py"):
        resolve_model_dir(tmp_path / "missing")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    snapshot = _hub_cache(tmp_path / "hf", retrieval_assets.encoder)
    assert resolve_model_dir(HUB_ID) == snapshot
    with pytest.raises(
        EncoderNotFoundError,
        match=r"tiny-org/absent: cannot fetch it from the Hugging Face hub "
        r"\(LocalEntryNotFoundError.*--what encoder",
    ):
        resolve_model_dir("tiny-org/absent")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_build_index_takes_a_hub_id_and_the_server_reopens_it(retrieval_assets, tmp_path):
    """The README's `build-index --model intfloat/e5-base-v2`, with the id served from the hub cache offline."""
    snapshot = _hub_cache(tmp_path / "hf", retrieval_assets.encoder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)}
    out = tmp_path / "index"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlinf_ext.cli",
            "build-index",
            "--corpus",
            str(retrieval_assets.corpus),
            "--out",
            str(out),
            "--retriever",
            "e5",
            "--model",
            HUB_ID,
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    meta = IndexMetadata.load(out)
    assert meta.model == str(snapshot.resolve())  # a directory the server can open, not the id
    assert meta.model_checksum == model_fingerprint(retrieval_assets.encoder)
    from rlinf_ext.retrieval.open import open_searcher

    searcher, _ = open_searcher(out, threads=1)
    assert searcher.search(["city"], 2)[1].shape == (1, 2)
