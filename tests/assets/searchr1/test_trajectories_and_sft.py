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
        'Doc 2(Title: "Brelk") Brelk is a city.\nSecond line.</information>\n\n'
    )


def test_two_hop_trajectory_turns():
    q = Question(
        "Who founded the capital of Zorvia?",
        ("Ana Vel",),
        (
            Hop("capital of Zorvia", Fact("The capital of Zorvia is", "Brelk")),
            Hop("founder of Brelk", Fact("The city of Brelk was founded by", "Ana Vel")),
        ),
    )
    segs = trajectories.trajectory_segments(q, ["<O1>", "<O2>"])
    assert [s.trainable for s in segs] == [True, False, True, False, True]
    assert (
        segs[0].text == "<think> I need to search for capital of Zorvia. </think>\n<search> capital of Zorvia </search>"
    )
    assert segs[2].text == (
        "<think> The capital of Zorvia is Brelk. Now I need to search for founder of Brelk. </think>\n"
        "<search> founder of Brelk </search>"
    )
    assert (
        segs[4].text
        == "<think> The city of Brelk was founded by Ana Vel. </think>\n<answer> Ana Vel </answer><|im_end|>"
    )
    # the copied spans are the facts' answers where the think step restates them (not the query, not <answer>)
    assert segs[0].copied == ()
    assert [segs[2].text[a:b] for a, b in segs[2].copied] == ["Brelk"]
    assert [segs[4].text[a:b] for a, b in segs[4].copied] == ["Ana Vel"] and segs[4].copied[0][1] < segs[4].text.index(
        "<answer>"
    )
    with pytest.raises(ValueError, match="one observation per hop"):
        trajectories.trajectory_segments(q, ["<O1>"])


def test_loss_mask_covers_exactly_the_generated_text(tiny_assets):
    """The warm-start row is the Search-R1 loop's own trajectory of the planned turns."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    q = Question(
        "What is the capital of Zorvia?",
        ("Brelk",),
        (Hop("capital of Zorvia", Fact("The capital of Zorvia is", "Brelk")),),
    )
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
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[0.0, 1.0, 5.0]])).item() == pytest.approx(
        0.6931, abs=1e-4
    )
    # position 1 predicted perfectly (loss ~0), position 2 uniform: weights 1 and 3 -> 3*ln2/4
    logits = torch.tensor([[[0.0, 50.0], [0.0, 0.0], [0.0, 0.0]]])
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[0.0, 1.0, 3.0]])).item() == pytest.approx(
        3 * 0.693147 / 4, abs=1e-4
    )
    # the first position is never a target
    assert sft_loop.weighted_lm_loss(logits, ids, torch.tensor([[100.0, 0.0, 1.0]])).item() == pytest.approx(
        0.693147, abs=1e-4
    )


def test_lr_schedule_warmup_then_cosine_to_a_tenth():
    cfg = sft.SFTConfig(steps=110, warmup_steps=10, lr=1.0)
    assert sft_loop.lr_at(0, cfg) == pytest.approx(0.1)
    assert sft_loop.lr_at(9, cfg) == pytest.approx(1.0)
    assert sft_loop.lr_at(10, cfg) == pytest.approx(1.0)
    assert sft_loop.lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sft_loop.lr_at(110, cfg) == pytest.approx(0.1)


def test_constant_schedule_holds_the_peak_after_warmup():
    from dataclasses import replace

    cfg = replace(sft.SFTConfig(steps=110, warmup_steps=10, lr=1.0), schedule="constant")
    assert [sft_loop.lr_at(k, cfg) for k in (0, 9, 10, 109)] == pytest.approx([0.1, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="schedule"):
        sft_loop.lr_at(0, replace(cfg, schedule="linear"))


@pytest.mark.timeout(120)
def test_short_sft_lowers_loss_and_saves_a_loadable_model(tiny_assets, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape
    from rlinf_ext.assets.core.tiny import make_tiny_assets

    root = tmp_path / "a"
    shutil.copytree(tiny_assets.root, root)
    assets = make_tiny_assets(root, seed=0)  # reuses the copy
    cfg = sft.SFTConfig(shape=TinyQwen2Shape(), steps=12, batch_size=4, warmup_steps=2, lr=3e-3)
    report = sft.build_sft_search_model(assets, seed=0, log=lambda *a: None, cfg=cfg)
    assert report["train_examples"] >= 0.9 * report["train_questions"]
    assert report["last_loss"] < report["first_loss"]
    out = root / "models" / "qwen2-tiny-sft-search"
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert json.loads((out / "sft_report.json").read_text())["config"]["steps"] == 12
    ids = tok("<think>", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def test_loss_on_targets_only_equals_the_full_logits_loss(tiny_assets):
    """`weighted_target_loss` (the LM head on weighted positions only) is `weighted_lm_loss`, value and gradient."""
    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    model = make_qwen2(tok, TinyQwen2Shape(), 0)
    examples = [
        sft_loop.SFTExample([5, 6, 7], [8, 9, 10, 11], [1.0, 0.0, 2.0, 1.0]),
        sft_loop.SFTExample([5], [12, 13], [3.0, 1.0]),
    ]
    ids, attn, weights = sft_loop.collate(examples, pad_id=0)
    full = sft_loop.weighted_lm_loss(model(input_ids=ids, attention_mask=attn).logits, ids, weights)
    full.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    part = sft_loop.weighted_target_loss(model, {"input_ids": ids, "attention_mask": attn}, ids, weights)
    part.backward()
    assert float(part) == pytest.approx(float(full), rel=1e-5)
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(grads, model.parameters()))


def test_check_ends_a_phase_at_its_gate(tiny_assets):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2

    tok = AutoTokenizer.from_pretrained(tiny_assets.tokenizer_dir)
    model = make_qwen2(tok, TinyQwen2Shape(), 0)
    seen = []
    cfg = replace(sft.SFTConfig(shape=TinyQwen2Shape(), steps=20, batch_size=1, warmup_steps=1, lr=1e-3))
    losses = sft_loop.train(
        model,
        [sft_loop.Stream([sft_loop.SFTExample([5], [6, 7], [1.0, 1.0])], 1, 0)],
        cfg,
        0,
        progress=False,
        check=lambda steps: seen.append((steps, model.training)) or steps >= 6,
        check_every=3,
    )
    assert len(losses) == 6 and seen == [(3, False), (6, False)]  # checked in eval mode, every 3 steps, ended at 6


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
