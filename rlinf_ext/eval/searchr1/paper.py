"""Published Search-R1 EM rows (paper v5, docs/searchr1-facts.md §8) for side-by-side comparison in reports."""

from __future__ import annotations

from dataclasses import dataclass

# Search-R1's evaluation settings (its evaluate.sh: max_turns=4, retriever.topk=3; vLLM in bf16 by its PPO trainer
# config; its generation loop retries an EOS without an action; docs/searchr1-facts.md §11), in results.SETTINGS' keys
SEARCHR1_EVAL_SETTINGS = {"max_turns": 4, "precision": "bf16", "on_no_action": "retry", "topk": 3}


@dataclass(frozen=True)
class PublishedRow:
    label: str
    em: dict[str, float]  # benchmark -> EM; empty when only the average was published
    avg: float
    settings: dict | None = None  # how it was evaluated (results.SETTINGS' keys); None: not Search-R1's pipeline


PUBLISHED_ROWS: tuple[PublishedRow, ...] = (
    PublishedRow(
        label="Search-R1 paper: Qwen2.5-3B-Instruct GRPO",
        em={
            "nq": 0.397,
            "triviaqa": 0.565,
            "popqa": 0.391,
            "hotpotqa": 0.331,
            "2wikimultihopqa": 0.310,
            "musique": 0.124,
            "bamboogle": 0.232,
        },
        avg=0.336,
        settings=SEARCHR1_EVAL_SETTINGS,
    ),
    PublishedRow(label="Search-R1 paper: Qwen2.5-3B-Instruct PPO", em={}, avg=0.325, settings=SEARCHR1_EVAL_SETTINGS),
    PublishedRow(label="Search-R1 paper: Qwen2.5-7B-base PPO", em={}, avg=0.431, settings=SEARCHR1_EVAL_SETTINGS),
    PublishedRow(label="Search-R1 paper: RAG (3B)", em={}, avg=0.270),
    PublishedRow(label="Search-R1 paper: IRCoT (3B)", em={}, avg=0.181),
    PublishedRow(label="Search-R1 paper: Search-o1 (3B)", em={}, avg=0.255),
)
