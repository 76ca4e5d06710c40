"""Warm-start data: observation text, trajectory turns, loss masks, and a short SFT run."""

from __future__ import annotations

import json

import pytest
import torch

from rlinf_ext.assets.core import sft as sft_loop
from rlinf_ext.assets.core.facts import Fact
from rlinf_ext.assets.core.search import CorpusTextSearch, LexicalRetriever, corpus_retriever
from rlinf_ext.assets.searchr1 import sft, trajectories
from rlinf_ext.assets.searchr1.qa import Hop, Question
from rlinf_ext.assets.searchr1.rows import chat_prompt


def _search(*docs: str) -> CorpusTextSearch:
    """The loop's search tool over just `docs` (corpus contents), top-1."""
    return CorpusTextSearch(LexicalRetriever(list(docs)), 1)


def test_format_observation_is_searchr1_layout():
    docs = ['"Zorvia"\nZorvia is a country.', '"Brelk"\nBrelk is a city.\nSecond line.']
    assert trajectories.format_observation(docs) == (
        '\n\n<information>Doc 1(Title: "Zorvia") Zorvia is a country.\n'
        'Doc 2(Title: "Brelk") Brelk is a city.\nSecond line.</information>\n\n')


def test_two_hop_trajectory_turns():
    q = Question("Who founded the capital of Zorvia?", ("Ana Vel",),
                 (Hop("capital of Zorvia", Fact("The capital of Zorvia is", "Brelk")),
                  Hop("founder of Brelk", Fact("The city of Brelk was founded by", "Ana Vel"))))
    segs = trajectories.trajectory_segments(q, ["<O1>", "<O2>"])
    assert [s.trainable for s in segs] == [True, False, True, False, True]
    assert segs[0].text == "<think> I need to search for capital of Zorvia. </think>\n<search> capital of Zorvia </search>"
    assert segs[2].text == ("<think> The capital of Zorvia is Brelk. Now I need to search for founder of Brelk. </think>\n"
                            "<search> founder of Brelk </search>")
    assert segs[4].text == "<think> The city of Brelk was founded by Ana Vel. </think>\n<answer> Ana Vel </answer><|im_end|>"
    # the copied spans are the facts' answers where the think step restates them (not the query, not <answer>)
    assert segs[0].copied == ()
    assert [segs[2].text[a:b] for a, b in segs[2].copied] == ["Brelk"]
    assert [segs[4].text[a:b] for a, b in segs[4].copied] == ["Ana Vel"] and segs[4].copied[0][1] < segs[4].text.index("<answer>")
    with pytest.raises(ValueError, match="one observation per hop"):
        trajectories.trajectory_segments(q, ["<O1>"])


def test_loss_mask_covers_exactly_the_generated_text(tiny_assets):
    """The warm-start row is the Search-R1 loop's own trajectory of the planned turns."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    q = Question("What is the capital of Zorvia?", ("Brelk",), (Hop("capital of Zorvia", Fact("The capital of Zorvia is", "Brelk")),))
    doc = '"Zorvia"\nZorvia is a country. The capital of Zorvia is Brelk.'
    obs = trajectories.format_observation([doc])
    segs = trajectories.trajectory_segments(q, [obs])
    [ex] = sft.build_examples(tok, [q], _search(doc), copy_weight=5.0)
    prompt = chat_prompt(tok, q.question)
    assert ex.prompt_ids == tok.encode(prompt, add_special_tokens=False)
    assert len(ex.response_ids) == len(ex.weights)
    kept = tok.decode([i for i, w in zip(ex.response_ids, ex.weights) if w])
    assert kept == segs[0].text + segs[2].text
    assert tok.decode([i for i, w in zip(ex.response_ids, ex.weights) if not w]) == obs
    assert tok.decode(ex.input_ids) == prompt + "".join(s.text for s in segs)
    copied = [i for i, w in zip(ex.response_ids, ex.weights) if w == 5.0]
    assert tok.decode(copied).strip() == "Brelk"
    assert set(ex.weights) == {0.0, 1.0, 5.0}
    # the end-of-turn token is trained, so the model learns to stop after </answer>
    assert ex.input_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and ex.loss_weights[-1] == 1.0
    # a trajectory whose observation misses the hop's fact is left out
    assert sft.build_examples(tok, [q], _search('"Zorvia"\nZorvia is a country.'), copy_weight=5.0) == []


def test_retrieval_finds_the_gold_passage_for_the_gold_queries(tiny_assets):
    from rlinf_ext.assets.core.world import build_world
    from rlinf_ext.assets.searchr1.qa import split_questions

    retriever = corpus_retriever(tiny_assets.corpus_path)
    splits = split_questions(build_world(0), 0)
    questions = [q for _, q in splits.train] + [q for qs in splits.test.values() for q in qs]
    hits = sum(sft.observation_has_answers(q, trajectories.gold_observations(q, retriever)) for q in questions)
    assert hits / len(questions) > 0.9  # BM25 top-3 on the hop queries nearly always holds the fact


def test_weighted_lm_loss_by_hand():
    # vocab 2, uniform logits: every target costs ln 2, whatever the weights
    logits = torch.zeros(1, 3, 2)
    ids = torch.tensor([[0, 1, 0]])
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[0.0, 1.0, 5.0]])).item() == pytest.approx(0.6931, abs=1e-4)
    # position 1 predicted perfectly (loss ~0), position 2 uniform: weights 1 and 3 -> 3*ln2/4
    logits = torch.tensor([[[0.0, 50.0], [0.0, 0.0], [0.0, 0.0]]])
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[0.0, 1.0, 3.0]])).item() == pytest.approx(3 * 0.693147 / 4, abs=1e-4)
    # the first position is never a target
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[100.0, 0.0, 1.0]])).item() == pytest.approx(0.693147, abs=1e-4)


def test_lr_schedule_warmup_then_cosine_to_a_tenth():
    cfg = sft.SFTConfig(steps=110, warmup_steps=10, lr=1.0)
    assert sft_loop.lr_at(0, cfg) == pytest.approx(0.1)
    assert sft_loop.lr_at(9, cfg) == pytest.approx(1.0)
    assert sft_loop.lr_at(10, cfg) == pytest.approx(1.0)
    assert sft_loop.lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sft_loop.lr_at(110, cfg) == pytest.approx(0.1)


@pytest.mark.timeout(120)
def test_short_sft_lowers_loss_and_saves_a_loadable_model(tiny_assets, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    root = tmp_path / "a"
    shutil.copytree(tiny_assets.root, root)
    assets = make_tiny_assets(root, seed=0)  # reuses the copy
    cfg = sft.SFTConfig(shape=TinyQwen2Shape(), steps=12, batch_size=4, warmup_steps=2, lr=3e-3, abstain_steps=3,
                        abstain_batch_size=2)
    report = sft.build_sft_model(assets, seed=0, log=lambda *a: None, cfg=cfg)
    assert report["train_examples"] >= 0.9 * report["train_questions"]
    assert report["abstain_examples"] == report["train_questions"]  # abstain_fraction 1.0: one per question
    assert report["last_loss"] < report["first_loss"]
    out = root / "models" / "qwen2-tiny-sft"
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert json.loads((out / "sft_report.json").read_text())["config"]["steps"] == 12
    ids = tok("<think>", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_give_up_phase_on_the_saved_search_model_equals_the_two_phases_in_one_run(tiny_assets, tmp_path):
    """The cache builds the give-up phase apart (only the experiment needs it): same weights as in one run."""
    import shutil

    from safetensors.torch import load_file

    from rlinf_ext.assets.core.models import TinyQwen2Shape
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    cfg = sft.SFTConfig(shape=TinyQwen2Shape(), steps=6, batch_size=4, warmup_steps=2, lr=3e-3, abstain_steps=3,
                        abstain_batch_size=2)
    dirs = []
    for name in ("one", "two"):
        shutil.copytree(tiny_assets.root, tmp_path / name)
        dirs.append(make_tiny_assets(tmp_path / name, seed=0))
    sft.build_sft_model(dirs[0], seed=0, log=lambda *a: None, cfg=cfg)
    sft.build_sft_search_model(dirs[1], seed=0, log=lambda *a: None, cfg=cfg)
    assert not (tmp_path / "two" / "models" / "qwen2-tiny-sft").exists()
    report = sft.build_give_up_model(dirs[1], seed=0, log=lambda *a: None, cfg=cfg)
    assert report["abstain_examples"] == report["train_questions"]
    for model in ("qwen2-tiny-sft-search", "qwen2-tiny-sft"):
        one, two = (load_file(tmp_path / d / "models" / model / "model.safetensors") for d in ("one", "two"))
        assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one), model
    search = load_file(tmp_path / "two" / "models" / "qwen2-tiny-sft-search" / "model.safetensors")
    assert any(not torch.equal(search[k], two[k]) for k in search)  # the give-up phase did train


def test_with_sft_reuses_the_base_assets(tiny_assets, tmp_path, monkeypatch):
    """Asking for the SFT model on an existing directory trains only that model and records it."""
    import shutil

    import rlinf_ext.assets.core.tiny as tiny
    from rlinf_ext.assets.core.tiny import make_tiny_assets, read_manifest

    root = tmp_path / "a"
    shutil.copytree(tiny_assets.root, root)
    manifest = read_manifest(root)
    if manifest.get("with_sft"):  # a reused asset directory may hold the SFT models already: start without them
        for name in ("qwen2-tiny-sft", "qwen2-tiny-sft-search"):
            shutil.rmtree(root / "models" / name, ignore_errors=True)
        manifest["files"] = {k: v for k, v in manifest["files"].items() if "qwen2-tiny-sft" not in k}
        (root / "MANIFEST.json").write_text(json.dumps({**manifest, "with_sft": False}))
    calls = []

    def fake_sft(assets, seed, log, cfg=None):  # the real training is covered above; here only the bookkeeping
        calls.append(seed)
        (assets.root / "models" / "qwen2-tiny-sft").mkdir(parents=True)
        (assets.root / "models" / "qwen2-tiny-sft" / "model.safetensors").write_bytes(b"x")

    monkeypatch.setattr(tiny, "build_sft_model", fake_sft)
    monkeypatch.setattr(tiny, "generate_base", lambda *a: pytest.fail("base assets must be reused"))
    corpus_mtime = (root / "corpus" / "wiki.jsonl").stat().st_mtime_ns
    assets = make_tiny_assets(root, seed=0, with_sft=True)
    assert calls == [0] and assets.qwen2_tiny_sft == root / "models" / "qwen2-tiny-sft"
    assert read_manifest(root)["with_sft"] is True
    assert "models/qwen2-tiny-sft/model.safetensors" in read_manifest(root)["files"]
    assert (root / "corpus" / "wiki.jsonl").stat().st_mtime_ns == corpus_mtime
    # now complete: a second call (with or without SFT) reuses everything
    assert make_tiny_assets(root, seed=0, with_sft=True) == assets
    assert calls == [0]
    assert make_tiny_assets(root, seed=0).qwen2_tiny_sft == assets.qwen2_tiny_sft


def _q(question: str, prefix: str, answer: str) -> Question:
    return Question(question, (answer,), (Hop(question, Fact(prefix, answer)),))


def test_abstain_trajectory_is_one_trainable_turn_without_search():
    segs = trajectories.abstain_turns()
    assert [s.trainable for s in segs] == [True]
    assert segs[0].text == "<think> I do not know the answer to this. </think>\n<answer> unknown </answer><|im_end|>"
    assert "<search>" not in segs[0].text and segs[0].copied == ()


def test_abstain_examples_follow_the_fraction(tiny_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    qs = [_q(f"Who founded C{i}?", f"The city of C{i} was founded by", f"Person {i}") for i in range(200)]
    examples = sft.build_abstain_examples(tok, qs, fraction=1.0, seed=0)
    assert len(examples) == len(qs)
    for q, ex in zip(qs, examples):
        assert tok.decode(ex.response_ids) == trajectories.ABSTAIN_TEXT and ex.weights == [1.0] * len(ex.response_ids)
        assert q.question in tok.decode(ex.prompt_ids)
    assert sft.build_abstain_examples(tok, qs, fraction=0.0, seed=0) == []
    assert 0.35 * 200 < len(sft.build_abstain_examples(tok, qs, fraction=0.5, seed=0)) < 0.65 * 200


@pytest.mark.slow
def test_sft_with_abstain_batches_learns_both_openings(tiny_assets):
    """A few steps on one search and one give-up trajectory of the same prompt: the model puts mass on both
    openings after `<think> I`, i.e. the second batch is trained, not ignored."""
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    q = _q("Who founded Brelk?", "The city of Brelk was founded by", "Ana Vel")
    prompt = chat_prompt(tok, q.question)
    [search] = sft.build_examples(tok, [q], _search('"Brelk"\nThe city of Brelk was founded by Ana Vel.'), 5.0)
    [abstain] = sft.build_abstain_examples(tok, [q], fraction=1.0, seed=0)
    cfg = sft.SFTConfig(shape=TinyQwen2Shape(), steps=40, batch_size=1, abstain_batch_size=1, warmup_steps=2, lr=5e-3)
    model = make_qwen2(tok, cfg.shape, 0)
    losses = sft.train_sft(model, [search], cfg, 0, tok.pad_token_id, progress=False, abstain_examples=[abstain])
    assert losses[-1] < losses[0]
    context = tok.encode(prompt + "<think> I", add_special_tokens=False)
    need = tok.encode(prompt + "<think> I need", add_special_tokens=False)[len(context)]
    give_up = tok.encode(prompt + "<think> I do", add_special_tokens=False)[len(context)]
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([context])).logits[0, -1], -1)
    assert probs[need] > 0.2 and probs[give_up] > 0.2, (float(probs[need]), float(probs[give_up]))
    # without the second batch the same run puts (almost) nothing on giving up
    model = make_qwen2(tok, cfg.shape, 0)
    sft.train_sft(model, [search], cfg, 0, tok.pad_token_id, progress=False)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([context])).logits[0, -1], -1)
    assert probs[give_up] < 0.05


def test_sft_example_from_a_loop_trajectory_and_its_batch():
    from types import SimpleNamespace

    t = SimpleNamespace(prompt_ids=[5, 6], response_ids=[7, 8, 9, 10], response_mask=[1, 0, 0, 1])
    ex = sft_loop.SFTExample.from_trajectory(t)
    assert ex.input_ids == [5, 6, 7, 8, 9, 10] and ex.loss_weights == [0, 0, 1, 0, 0, 1] and ex.images == ()
    with pytest.raises(ValueError, match="did not generate"):
        sft_loop.SFTExample.from_trajectory(t, [1.0, 1.0, 0.0, 1.0])
    short = sft_loop.SFTExample([1], [2], [3.0])
    ids, attn, weights = sft_loop.collate([ex, short], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 10], [1, 2, 0, 0, 0, 0]]
    assert attn.tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    assert weights.tolist() == [[0, 0, 1, 0, 0, 1], [0, 3, 0, 0, 0, 0]]
