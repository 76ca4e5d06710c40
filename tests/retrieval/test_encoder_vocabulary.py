"""The dense encoder's WordPiece vocabulary survives building, saving and loading.

transformers 5 renamed BertTokenizer's vocabulary argument to `vocab`: `vocab_file=...` is swallowed by **kwargs
and the tokenizer keeps its 5 special tokens, so every word encodes to [UNK], all passages embed alike and dense
retrieval degenerates without an error.
"""

from __future__ import annotations

import torch


def test_the_tiny_encoder_keeps_its_whole_vocabulary(retrieval_assets):
    from rlinf_ext.retrieval.encoder import EncoderSpec, TextEncoder

    lines = [t for t in (retrieval_assets.encoder / "vocab.txt").read_text().splitlines() if t]
    encoder = TextEncoder(EncoderSpec.for_retriever("e5", str(retrieval_assets.encoder)))
    tok = encoder.tokenizer
    assert len(tok) == len(lines) > 100
    assert int(encoder.model.config.vocab_size) >= len(tok)
    words = [w for w in lines if w.isalpha() and len(w) > 3][:20]
    ids = tok(" ".join(words), add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and len(set(ids)) >= len(set(words))
    vectors = torch.from_numpy(encoder.encode([words[0], words[1], " ".join(words[2:8])], is_query=False))
    assert not torch.allclose(vectors[0], vectors[1]) and not torch.allclose(vectors[0], vectors[2])


def test_build_wordpiece_keeps_its_vocabulary(tmp_path):
    from rlinf_ext.assets.core.models import build_wordpiece

    texts = ["Paris is the capital of France.", "The river Seine flows through Paris."] * 3
    tok = build_wordpiece(texts, tmp_path / "wp", vocab_size=200)
    lines = (tmp_path / "wp" / "vocab.txt").read_text().split()
    assert len(tok) == len(lines) > 5
    assert tok.unk_token_id not in tok("paris capital river", add_special_tokens=False).input_ids
