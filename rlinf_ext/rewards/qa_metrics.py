"""QA answer metrics (pure functions): normalisation, answer extraction, EM, subEM, token F1.

Extraction reads the *response only* (the prompt's own `<answer> Beijing </answer>` example must never count,
which is Search-R1's bug) and ignores text inside inserted `<information>` blocks, which is corpus text, not
the model's answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INFORMATION_RE = re.compile(r"<information>.*?(</information>|$)", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/Search-R1 normalisation: lowercase, drop ASCII punctuation, drop articles, collapse spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def golden_list(golden_answers: Any) -> list[str]:
    """Accept a string, a list/tuple/array of strings, or Search-R1's `{"target": [...]}`."""
    if isinstance(golden_answers, Mapping):
        if "target" not in golden_answers:
            raise ValueError(
                f"golden answers given as a mapping need a 'target' key (Search-R1 layout), got keys "
                f"{sorted(golden_answers)}"
            )
        golden_answers = golden_answers["target"]
    if isinstance(golden_answers, str):
        return [golden_answers]
    if hasattr(golden_answers, "tolist"):  # numpy arrays from parquet
        golden_answers = golden_answers.tolist()
    if isinstance(golden_answers, Sequence):
        return [str(answer) for answer in golden_answers]
    raise TypeError(f"golden answers must be a str, a list of str or {{'target': [...]}}, got {type(golden_answers)}")


def strip_information(response: str) -> str:
    """Remove inserted `<information>…</information>` blocks (an unclosed one runs to the end)."""
    return _INFORMATION_RE.sub(" ", response)


def extract_answer(response: str) -> str | None:
    """The content of the last `<answer>…</answer>` in the model's response, stripped; None if absent."""
    matches = _ANSWER_RE.findall(strip_information(response))
    return matches[-1].strip() if matches else None


def count_answer_tags(response: str) -> int:
    """max(#`<answer>`, #`</answer>`) in the model's own text (the >limit penalty counts both)."""
    text = strip_information(response)
    return max(text.count("<answer>"), text.count("</answer>"))


def em_score(prediction: str, golden_answers: Any) -> float:
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(gold) == normalized for gold in golden_list(golden_answers)))


def subem_score(prediction: str, golden_answers: Any) -> float:
    """1 if a normalised gold answer is a substring of the normalised prediction."""
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(gold) in normalized for gold in golden_list(golden_answers)))


def f1_score(prediction: str, golden_answers: Any) -> float:
    """Best token-level F1 over the gold answers (SQuAD definition on normalised tokens)."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_list(golden_answers):
        gold_tokens = normalize_answer(gold).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(response: str, golden_answers: Any) -> float:
    """EM of the last `<answer>` in the response against any gold answer (0 when there is no answer)."""
    answer = extract_answer(response)
    return 0.0 if answer is None else em_score(answer, golden_answers)


def sub_exact_match(response: str, golden_answers: Any) -> float:
    answer = extract_answer(response)
    return 0.0 if answer is None else subem_score(answer, golden_answers)


def f1(response: str, golden_answers: Any) -> float:
    answer = extract_answer(response)
    return 0.0 if answer is None else f1_score(answer, golden_answers)
