"""Search-R1 QA rows in the two on-disk forms the project reads: Search-R1 parquet and RLinf jsonl."""

from __future__ import annotations

from rlinf_ext.assets.searchr1.qa import Question

# Search-R1's `base` prompt (docs/searchr1-facts.md §1); the tags must stay exactly as written.
SEARCHR1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def searchr1_prompt(question: str) -> str:
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return SEARCHR1_PROMPT.format(question=question)


def searchr1_row(q: Question, data_source: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": searchr1_prompt(q.question)}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": list(q.answers)}, "style": "rule"},
        "extra_info": {"split": split, "index": index},
    }


def chat_prompt(tokenizer, question: str) -> str:
    """The chat-formatted prompt of `question`, as the RLinf rows hold it and the agent loop tokenises it."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": searchr1_prompt(question)}], tokenize=False, add_generation_prompt=True
    )


def rlinf_row(q: Question, data_source: str, uid: str, tokenizer) -> dict:
    """RLinf jsonl row; the prompt is already chat-formatted (RLinf's `apply_chat_template: False` form)."""
    return {
        "prompt": chat_prompt(tokenizer, q.question),
        "solutions": list(q.answers),
        "data_source": data_source,
        "uid": uid,
    }
