"""`make-tiny-assets --with-registry`: the registry world's files under ``<assets>/registry``.

- ``corpus/wiki.jsonl``: the registry pages as Search-R1 corpus rows (``corpus/wiki_ablated.jsonl``: the tool-ablation
  control's corpus, every page without the pairs of the subjects any question asks about, so a search never
  returns the asked pair);
- ``data/train.jsonl`` / ``data/heldout.jsonl``: RLinf jsonl rows (chat-formatted prompt, solutions, the relation as
  ``data_source``, uid) of the 400 train and the 160 held-out questions;
- ``models/qwen2-tiny-reader``: the warm start (`warm_start.py`) with its tokenizer and ``sft_report.json``;
- ``report.json``: the world's counts, the split checks, the warm start's phases and its gate on held-out questions.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlinf_ext.assets.core import formats
from rlinf_ext.assets.core.search import LexicalRetriever
from rlinf_ext.assets.core.tokenizer import DEFAULT_SYSTEM
from rlinf_ext.assets.registry import tokenizer as registry_tokenizer
from rlinf_ext.assets.registry import warm_start
from rlinf_ext.assets.registry.turns import answer_turn, give_up_turn, search_turn
from rlinf_ext.assets.registry.world import HELDOUT, PAGE_ONLY, TRAIN, Fact, Page, RegistryWorld, build_registry_world
from rlinf_ext.assets.searchr1.rows import searchr1_prompt

REGISTRY_DIR = "registry"
READER_MODEL = "qwen2-tiny-reader"


@dataclass(frozen=True)
class RegistryPaths:
    root: Path  # <assets>/registry
    corpus: Path
    corpus_ablated: Path
    train: Path
    heldout: Path
    model: Path
    report: Path


def registry_paths(assets_root: Path) -> RegistryPaths:
    root = Path(assets_root) / REGISTRY_DIR
    return RegistryPaths(
        root,
        root / "corpus" / "wiki.jsonl",
        root / "corpus" / "wiki_ablated.jsonl",
        root / "data" / "train.jsonl",
        root / "data" / "heldout.jsonl",
        root / "models" / READER_MODEL,
        root / "report.json",
    )


def corpus_rows(pages) -> list[dict]:
    return [{"id": str(i), "contents": p.contents} for i, p in enumerate(pages)]


def ablated_pages(world: RegistryWorld):
    """The pages without any pair whose subject a question asks about (train or held-out); empty pages dropped."""
    out = []
    for page in world.pages:
        kept = tuple(f for f in page.facts if world.split_of[f.subject] == PAGE_ONLY)
        if kept:
            out.append(Page(page.relation, page.number, kept))
    return out


def question_rows(questions, split: str, tokenizer) -> list[dict]:
    prompt = tokenizer.apply_chat_template
    return [
        {
            "prompt": prompt(
                [{"role": "user", "content": searchr1_prompt(q.question)}], tokenize=False, add_generation_prompt=True
            ),
            "solutions": [q.answer],
            "data_source": q.relation,
            "uid": f"registry-{split}-{i}",
        }
        for i, q in enumerate(questions)
    ]


def world_stats(world: RegistryWorld) -> dict:
    train, heldout = world.questions(TRAIN), world.questions(HELDOUT)
    train_subjects, heldout_subjects = {q.subject for q in train}, {q.subject for q in heldout}
    train_answers = {q.answer for q in train}
    return {
        "pages": len(world.pages),
        "facts": len(world.facts),
        "train_questions": len(train),
        "heldout_questions": len(heldout),
        "names": len(world.all_names),
        "heldout_subjects_asked_in_train": len(train_subjects & heldout_subjects),
        # a held-out answer may be a train answer of another relation (a city is a capital and a birthplace):
        # reported, not a leak, since no held-out pair is ever trained
        "heldout_answers_also_train_answers": sum(q.answer in train_answers for q in heldout),
    }


def _tokenizer(world: RegistryWorld):
    """The world's tokenizer, its BPE learnt from the prompt, the templates and the agent's turns."""
    placeholder = registry_tokenizer.PLACEHOLDER

    def prompt_of(question: str) -> str:  # the chat scaffolding without its special tokens (as the base world's)
        return f"system\n{DEFAULT_SYSTEM}\nuser\n{searchr1_prompt(question)}\nassistant\n"

    turns = [
        search_turn(f"capital of {placeholder}").text,
        give_up_turn().text,
        answer_turn(Fact("capital", placeholder, placeholder)).text,
    ]
    return registry_tokenizer.build_tokenizer(world, prompt_of, turns)


def generate_registry(
    root: Path, seed: int, log: Callable[..., None], cfg: warm_start.WarmStartConfig = warm_start.WarmStartConfig()
) -> dict[str, float]:
    """Write the registry world and train its warm start; returns seconds per stage."""
    t0 = time.perf_counter()
    paths = registry_paths(root)
    world = build_registry_world(seed)
    tok = _tokenizer(world)
    formats.write_jsonl(corpus_rows(world.pages), paths.corpus)
    formats.write_jsonl(corpus_rows(ablated_pages(world)), paths.corpus_ablated)
    formats.write_jsonl(question_rows(world.questions(TRAIN), TRAIN, tok), paths.train)
    formats.write_jsonl(question_rows(world.questions(HELDOUT), HELDOUT, tok), paths.heldout)
    stats = world_stats(world)
    log(
        f"registry world: {stats['pages']} pages, {stats['train_questions']} train / {stats['heldout_questions']} "
        f"held-out questions, {stats['names']} one-token names -> {paths.root}"
    )
    t1 = time.perf_counter()
    retriever = LexicalRetriever([p.contents for p in world.pages])
    model, report = warm_start.train_warm_start(world, tok, retriever, seed, log, cfg)
    t2 = time.perf_counter()
    gate = warm_start.gate_report(model, tok, world, retriever, seed)
    figures = gate["heldout"]
    log(
        "registry warm start on held-out questions: "
        + ", ".join(
            f"{k} {figures[k]:.3f}"
            for k in (
                "greedy_em",
                "pass@1",
                "pass@8",
                "wrong_that_are_candidates",
                "right_vs_each_distractor",
                "counterfactual_follow",
                "no_observation_em",
                "retrieval_top1_query",
            )
        )
        + f"; gate {'passed' if gate['gate_passed'] else 'MISSED: ' + str(gate['gate'])}"
    )
    report = {**report, "world": stats, **gate}
    warm_start.save_warm_start(model, tok, paths.model, report)
    paths.report.write_text(json.dumps(report, indent=1) + "\n")
    t3 = time.perf_counter()
    return {
        "registry_world": round(t1 - t0, 2),
        "registry_warm_start": round(t2 - t1, 2),
        "registry_gate": round(t3 - t2, 2),
    }


def manifest_entry(root: Path) -> dict:
    """What MANIFEST.json records of the registry part: the split checks and the warm start's gate."""
    report = json.loads(registry_paths(root).report.read_text())
    figures = report["heldout"]
    return {
        "heldout_fact_overlap": report["heldout_fact_overlap"],
        "no_observation_em": figures["no_observation_em"],
        "retrieval_top1_query": figures["retrieval_top1_query"],
        "retrieval_top1_question": figures["retrieval_top1_question"],
        "heldout_subjects_asked_in_train": report["world"]["heldout_subjects_asked_in_train"],
        "warm_start_gate": {k: figures[k] for k, _, _ in warm_start.GATE},
        "warm_start_gate_passed": report["gate_passed"],
    }
