"""Greedy EM of a warm-started model on the test questions, with and without the retrieved documents.

Three settings, all greedy:
- `gold_obs`: the gold searches and their top-k observations are given; the model writes the final answer.
- `no_obs`: the same turns, but every observation is an empty `<information></information>` block, so the
  answer can only come from the weights (should be near 0: the facts are invented).
- `live`: the model runs the whole loop itself (its own queries, BM25 top-k, up to `max_turns` searches).
"""

from __future__ import annotations

import torch

from rlinf_ext.assets.core.search import LexicalRetriever, corpus_retriever
from rlinf_ext.assets.core.world import build_world
from rlinf_ext.assets.searchr1 import trajectories
from rlinf_ext.assets.searchr1.qa import Question, split_questions
from rlinf_ext.assets.searchr1.rows import chat_prompt
from rlinf_ext.rewards.qa_metrics import exact_match

STOPS = ["</search>", "</answer>"]
EMPTY_OBSERVATION = "\n\n<information></information>\n\n"


def greedy_continue(model, tokenizer, text: str, max_new_tokens: int = 48) -> str:
    """Greedy continuation of `text`, stopped after `</search>` / `</answer>` or at an end-of-turn token."""
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            stop_strings=STOPS,
            tokenizer=tokenizer,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _search_query(text: str) -> str | None:
    if "<search>" in text and text.rstrip().endswith("</search>"):
        return text.rsplit("<search>", 1)[1].rsplit("</search>", 1)[0].strip()
    return None


def answer_with_context(model, tokenizer, q: Question, observations: list[str]) -> str:
    """Feed the gold turns (with the given observations), let the model write the final turn."""
    segs = trajectories.trajectory_segments(q, observations)[:-1]
    return greedy_continue(model, tokenizer, chat_prompt(tokenizer, q.question) + "".join(s.text for s in segs))


def answer_live(model, tokenizer, q: Question, retriever: LexicalRetriever, topk: int = 3, max_turns: int = 3) -> str:
    context = chat_prompt(tokenizer, q.question)
    response = ""
    for _ in range(max_turns + 1):
        step = greedy_continue(model, tokenizer, context + response)
        response += step
        query = _search_query(step)
        if query is None:
            break
        response += trajectories.format_observation(retriever.search([query], topk)[0])
    return response


def evaluate(
    model,
    tokenizer,
    tests: dict[str, list[Question]],
    retriever: LexicalRetriever,
    topk: int = 3,
    modes=("gold_obs", "no_obs", "live"),
) -> dict[str, dict[str, float]]:
    """EM per benchmark and mode (plus `avg`), e.g. `{"nq": {"gold_obs": 0.6, ...}, ...}`."""
    model.eval()
    table: dict[str, dict[str, float]] = {}
    for bench, qs in tests.items():
        row = {}
        for mode in modes:
            scores = []
            for q in qs:
                if mode == "live":
                    resp = answer_live(model, tokenizer, q, retriever, topk)
                else:
                    obs = trajectories.gold_observations(q, retriever, topk)
                    if mode == "no_obs":
                        obs = [EMPTY_OBSERVATION] * len(obs)
                    resp = answer_with_context(model, tokenizer, q, obs)
                scores.append(exact_match(resp, list(q.answers)))
            row[mode] = sum(scores) / len(scores)
        table[bench] = row
    table["avg"] = {m: sum(table[b][m] for b in tests) / len(tests) for m in modes}
    return table


def evaluate_assets(
    assets, topk: int = 3, modes=("gold_obs", "no_obs", "live"), model_dir=None
) -> dict[str, dict[str, float]]:
    """`evaluate` on a generated asset directory's warm start (or ``model_dir``) and its seven test files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_dir is None and assets.qwen2_tiny_sft_search is None:
        raise ValueError("these assets have no warm-started model; generate them with --with-sft-search")
    model_dir = model_dir or assets.qwen2_tiny_sft_search
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tests = split_questions(build_world(assets.seed), assets.seed).test
    return evaluate(model, tokenizer, tests, corpus_retriever(assets.corpus_path), topk, modes)


def format_table(table: dict[str, dict[str, float]]) -> str:
    modes = list(next(iter(table.values())))
    lines = ["greedy EM   " + "".join(f"{m:>10}" for m in modes)]
    for bench, row in table.items():
        lines.append(f"{bench:<12}" + "".join(f"{row[m]:>10.3f}" for m in modes))
    return "\n".join(lines)
