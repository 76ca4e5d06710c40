"""MMSearch-R1's training data (``AgentSpec.dataset``): FVQA questions with their first prompt tokenised by the
vision-language processor. Validation reads its FVQA files itself (``eval/mmsearch/validation.py``)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlinf_ext.agent.mmsearch.loop import first_prompt_ids
from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.agent.mmsearch.types import Task
from rlinf_ext.data.fvqa import read_fvqa


class TaskDataset(torch.utils.data.Dataset):
    """FVQA questions ``{"uid", "answers", "prompt_ids", "task"}``; over-long first prompts dropped (counted)."""

    def __init__(self, paths: Sequence[str], cfg: Any):
        # lazy: imports transformers, which the launcher loads only once it reads the data
        from rlinf_ext.generation.hf_vl import load_vl_processor

        data = cfg.data
        processor = load_vl_processor(str(cfg.rollout.model.model_path))
        mm = cfg.agentloop.mmsearch
        prompts = Prompts.from_config(mm.prompts)
        limit = None if int(data.data_size) < 0 else int(data.data_size)
        self.items, self.dropped = [], 0
        for path in paths:
            for row in read_fvqa(path, int(mm.image_min_pixels), int(mm.image_max_pixels), limit=limit):
                task = Task.from_row(row)
                ids = first_prompt_ids(processor, prompts, task)
                if len(ids) > data.max_prompt_length:
                    self.dropped += 1
                    continue
                self.items.append({"uid": task.data_id, "answers": list(task.answers), "prompt_ids": ids, "task": task})
        if not self.items:
            raise ValueError(
                f"no question fits data.max_prompt_length={data.max_prompt_length} ({self.dropped} dropped)."
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def build_datasets(cfg: Any) -> tuple[TaskDataset, None]:
    return TaskDataset(cfg.data.train_data_paths, cfg), None
