"""The generated tiny assets: layout, determinism, QA/corpus consistency, tokenizer and model loading."""

from __future__ import annotations

import dataclasses
import json
import re

import pandas as pd
import pytest
import torch

from rlinf_ext.assets.core.formats import read_jsonl
from rlinf_ext.assets.core.tiny import (
    GENERATOR_VERSION,
    Parts,
    complete_assets,
    make_tiny_assets,
    read_manifest,
    sha256_file,
)
from rlinf_ext.assets.core.tokenizer import TAG_TOKENS
from rlinf_ext.assets.searchr1.qa import BENCHMARKS
from rlinf_ext.assets.searchr1.rows import searchr1_prompt


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A second seed-0 directory and a seed-1 directory, generated from scratch."""
    same = make_tiny_assets(tmp_path_factory.mktemp("seed0_again"), seed=0)
    other = make_tiny_assets(tmp_path_factory.mktemp("seed1"), seed=1)
    return same, other


def _content_files(assets) -> dict[str, str]:
    return read_manifest(assets.root)["files"]


def test_layout_matches_contract(tiny_assets):
    a = tiny_assets
    for p in [
        a.corpus_path,
        a.pages_path,
        a.searchr1_train,
        a.rlinf_train,
        a.manifest_path,
        *a.searchr1_test.values(),
        *a.rlinf_test.values(),
    ]:
        assert p.is_file(), p
    assert a.corpus_path == a.root / "corpus" / "wiki.jsonl"
    assert (
        list(a.searchr1_test)
        == list(BENCHMARKS)
        == ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
    )
    for d in [a.tokenizer_dir, a.qwen2_tiny, a.qwen2_tiny_untied, a.bert_encoder]:
        assert (d / "tokenizer_config.json").is_file(), d
    for d in [a.qwen2_tiny, a.qwen2_tiny_untied, a.bert_encoder]:
        assert (d / "model.safetensors").is_file() and (d / "config.json").is_file()
    manifest = read_manifest(a.root)
    # the session's directory as it is now (a test before may have added a part to it); without --with-sft-search /
    # --with-registry those parts are absent, unless a reused directory has them
    a = complete_assets(a.root, 0, Parts.of_manifest(manifest))
    assert (a.qwen2_tiny_sft_search is None) == (not manifest.get("with_sft_search"))
    assert (a.registry is None) == (not manifest.get("with_registry"))
    assert manifest["seed"] == 0 and manifest["version"] == GENERATOR_VERSION
    # the manifest's hashes are those of the files on disk
    for rel, digest in manifest["files"].items():
        assert sha256_file(a.root / rel) == digest, rel


def test_same_seed_same_bytes_different_seed_differs(tiny_assets, regenerated):
    same, other = regenerated
    base = _content_files(tiny_assets)
    # every file a fresh seed-0 generation writes has the same bytes here (a reused RLINF_EXT_TINY_ASSETS
    # directory may hold more: the warm-started models)
    fresh = _content_files(same)
    assert {k: base.get(k) for k in fresh} == fresh
    differing = {k for k, v in _content_files(other).items() if base.get(k) != v}
    for rel in [
        "corpus/wiki.jsonl",
        "data/searchr1/train.parquet",
        "data/rlinf/test/nq.jsonl",
        "models/qwen2-tiny/model.safetensors",
        "models/bert-tiny-encoder/model.safetensors",
    ]:
        assert rel in differing, rel


def test_corpus_rows_are_searchr1_and_pages_match(tiny_assets):
    rows = read_jsonl(tiny_assets.corpus_path)
    assert 250 <= len(rows) <= 1000
    assert [r["id"] for r in rows] == [str(i) for i in range(len(rows))]
    titles = set()
    for r in rows:
        assert set(r) == {"id", "contents", "url"}
        m = re.fullmatch(r'"([^"\n]+)"\n(.+)', r["contents"], flags=re.S)
        assert m, r["contents"][:80]
        titles.add(m.group(1))
        assert r["url"] == "https://en.wikipedia.org/wiki/" + m.group(1).replace(" ", "_")
    pages = read_jsonl(tiny_assets.pages_path)
    assert {p["title"] for p in pages} == titles
    assert all(set(p) == {"url", "title", "contents"} and p["contents"] for p in pages)


def _searchr1(path):
    df = pd.read_parquet(path)
    return [
        {
            "source": r.data_source,
            "content": r.prompt[0]["content"],
            "role": r.prompt[0]["role"],
            "target": list(r.reward_model["ground_truth"]["target"]),
            "style": r.reward_model["style"],
            "split": r.extra_info["split"],
            "index": int(r.extra_info["index"]),
            "ability": r.ability,
        }
        for r in df.itertuples()
    ]


def _all_files(a):
    yield "train", a.searchr1_train, a.rlinf_train
    for b in BENCHMARKS:
        yield b, a.searchr1_test[b], a.rlinf_test[b]


def test_qa_files_parse_and_the_two_formats_agree(tiny_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    uids = set()
    for name, pq_path, jl_path in _all_files(tiny_assets):
        sr1, rl = _searchr1(pq_path), read_jsonl(jl_path)
        assert len(sr1) == len(rl) and (len(sr1) == 400 if name == "train" else 10 <= len(sr1) <= 30), name
        assert [r["index"] for r in sr1] == list(range(len(sr1)))
        for a, b in zip(sr1, rl):
            assert a["role"] == "user" and a["style"] == "rule" and a["ability"] == "fact-reasoning"
            assert a["split"] == ("train" if name == "train" else "test")
            assert a["source"] == b["data_source"]
            assert a["source"] in (("nq", "hotpotqa") if name == "train" else (name,))
            assert a["target"] == b["solutions"] and a["target"]
            question = a["content"].rsplit("Question: ", 1)[1].rstrip("\n")
            assert a["content"] == searchr1_prompt(question)
            expected = tok.apply_chat_template(
                [{"role": "user", "content": a["content"]}], tokenize=False, add_generation_prompt=True
            )
            assert b["prompt"] == expected
            assert b["uid"] not in uids
            uids.add(b["uid"])


def test_train_and_test_questions_are_disjoint(tiny_assets):
    train = {r["content"] for r in _searchr1(tiny_assets.searchr1_train)}
    seen = set()
    for b in BENCHMARKS:
        qs = {r["content"] for r in _searchr1(tiny_assets.searchr1_test[b])}
        assert not qs & train and not qs & seen, b
        seen |= qs


def test_every_answer_is_in_the_corpus_and_not_in_the_question(tiny_assets):
    corpus = "\n".join(r["contents"] for r in read_jsonl(tiny_assets.corpus_path))
    for name, pq_path, _ in _all_files(tiny_assets):
        for r in _searchr1(pq_path):
            assert r["target"][0] in corpus, (name, r["target"])
            question = r["content"].rsplit("Question: ", 1)[1]
            assert r["target"][0] not in question, (name, question)


def test_tokenizer_roundtrip_tags_and_specials(tiny_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    assert 1000 <= len(tok) <= 2100
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(t)) == 1 and tok.convert_ids_to_tokens(tok.encode(t))[0] == t
    text = (
        "<think> I need the capital. </think>\n<search> capital of Zorvia </search>\n\n<information>Doc 1(Title: "
        '"Zorvia") Zorvia is a country. Ünïcödé 1234</information>\n\n<answer> Brelk </answer>'
    )
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # tags are single, non-special tokens: still there after skip_special_tokens (stop strings need them)
    for tag in TAG_TOKENS:
        assert len(tok.encode(tag)) == 1, tag
        assert tag in tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(tok.encode("<answer> x </answer><|im_end|>"), skip_special_tokens=True) == "<answer> x </answer>"


def test_chat_template_is_qwen2_5_layout(tiny_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    out = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        tokenize=False,
    )
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"


@pytest.mark.parametrize("which,tied", [("qwen2_tiny", True), ("qwen2_tiny_untied", False)])
def test_qwen2_models_load_and_give_finite_logits(tiny_assets, which, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = getattr(tiny_assets, which)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 2, 1)
    assert cfg.tie_word_embeddings is tied and cfg.vocab_size % 64 == 0 and cfg.vocab_size >= len(tok)
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # qkv bias, as Qwen2
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) is tied
    assert model.dtype == torch.float32
    ids = tok("Who founded the city?", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size) and torch.isfinite(logits).all()
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]


def test_bert_encoder_loads_and_encodes(tiny_assets):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_assets.bert_encoder).eval()
    tok = AutoTokenizer.from_pretrained(tiny_assets.bert_encoder)
    batch = tok(["query: capital of Zorvia", "passage: Zorvia is a country."], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out.shape == (2, batch.input_ids.shape[1], model.config.hidden_size) and torch.isfinite(out).all()
    assert batch.input_ids[0, 0].item() == tok.cls_token_id


def test_manifest_reuse_does_not_regenerate_or_rewrite(tiny_assets, monkeypatch):
    import rlinf_ext.assets.core.generate as generate

    def fail(*args, **kwargs):
        raise AssertionError("a matching MANIFEST.json must be reused, not regenerated")

    monkeypatch.setattr(generate, "generate_base", fail)
    lock_files = (".lock", ".lock.holder")  # the builders' lock and its holder note, rewritten by every build call
    before = {p: p.stat().st_mtime_ns for p in tiny_assets.root.rglob("*") if p.is_file() and p.name not in lock_files}
    again = make_tiny_assets(tiny_assets.root, seed=0)
    # the session's directory may have gained optional parts (warm starts, the multimodal world) since the
    # fixture ran: every part the fixture saw is found again, the same
    seen = {f.name: getattr(tiny_assets, f.name) for f in dataclasses.fields(tiny_assets)}
    assert {k: getattr(again, k) for k, v in seen.items() if v is not None} == {
        k: v for k, v in seen.items() if v is not None
    }
    after = {p: p.stat().st_mtime_ns for p in tiny_assets.root.rglob("*") if p.is_file() and p.name not in lock_files}
    assert after == before


def test_incomplete_or_other_seed_directory_is_regenerated(tmp_path, tiny_assets):
    import shutil

    d = tmp_path / "assets"
    shutil.copytree(tiny_assets.root, d)
    manifest = json.loads((d / "MANIFEST.json").read_text())
    manifest["seed"] = 7  # claims another seed: must not be reused for seed 0
    (d / "MANIFEST.json").write_text(json.dumps(manifest))
    (d / "corpus" / "wiki.jsonl").write_text("garbage\n")
    make_tiny_assets(d, seed=0)
    assert (d / "corpus" / "wiki.jsonl").read_bytes() == tiny_assets.corpus_path.read_bytes()
    assert read_manifest(d)["seed"] == 0
