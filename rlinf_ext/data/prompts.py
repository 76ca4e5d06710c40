"""Training prompts: RLinf-style jsonl rows in, tokenised ``{"prompt_ids", "answers", "uid"}`` items out.

The trainer's ``DataLoader`` draws from a ``PromptDataset``; ``load_jsonl_prompts`` reads ``data.train_data_paths``
with ``data.prompt_key`` / ``data.answer_key``. Prompts are pre-formatted (chat template already applied by
``rlinf-ext preprocess``); prompts over ``data.max_prompt_length`` tokens are dropped and counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch


def load_jsonl_prompts(
    paths: Sequence[str | Path], prompt_key: str = "prompt", answer_key: str = "solutions", data_size: int = -1
) -> list[dict]:
    """RLinf-style jsonl rows ``{prompt, solutions, uid?}`` -> ``[{"prompt", "answers", "uid"}]``."""
    rows: list[dict] = []
    for path in paths:
        with open(path) as f:
            file_rows = [json.loads(line) for line in f if line.strip()]
        if data_size >= 0:
            file_rows = file_rows[:data_size]
        for i, row in enumerate(file_rows):
            if prompt_key not in row or answer_key not in row:
                raise ValueError(
                    f"{path}:{i + 1}: row lacks {prompt_key!r} or {answer_key!r} (data.prompt_key/answer_key)."
                )
            rows.append(
                {
                    "prompt": row[prompt_key],
                    "answers": row[answer_key],
                    "uid": str(row.get("uid", f"{Path(path).stem}-{i}")),
                }
            )
    return rows


class PromptDataset(torch.utils.data.Dataset):
    """Tokenised prompts ``{"prompt_ids", "answers", "uid"}``; over-long prompts are dropped (counted)."""

    def __init__(self, rows: Sequence[dict], tokenizer: Any, max_prompt_length: int):
        self.items = []
        self.dropped = 0
        for row in rows:
            ids = row.get("prompt_ids")
            if ids is None:
                ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
            if len(ids) > max_prompt_length:
                self.dropped += 1
                continue
            self.items.append(
                {"prompt_ids": list(ids), "answers": row["answers"], "uid": str(row.get("uid", len(self.items)))}
            )
        if not self.items:
            raise ValueError(f"no prompt fits data.max_prompt_length={max_prompt_length} ({self.dropped} dropped).")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def build_prompt_datasets(cfg: Any) -> tuple[PromptDataset, PromptDataset | None]:
    """The text agents' datasets (``AgentSpec.dataset``): ``data.train_data_paths`` and ``data.val_data_paths``
    tokenised with the rollout model's tokenizer."""
    from transformers import AutoTokenizer  # heavy: loaded once the launcher reads the data, not at import

    data = cfg.data
    tokenizer = AutoTokenizer.from_pretrained(cfg.rollout.model.model_path)

    def dataset(paths: Sequence[str]) -> PromptDataset:
        rows = load_jsonl_prompts(list(paths), data.prompt_key, data.answer_key, data.data_size)
        return PromptDataset(rows, tokenizer, data.max_prompt_length)

    return dataset(data.train_data_paths), dataset(data.val_data_paths) if data.val_data_paths else None
