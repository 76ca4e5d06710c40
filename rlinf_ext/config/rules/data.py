"""Data rules: the files a run reads are named (their existence is ``paths.py``'s, with ``check_paths``)."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


@rule("runner.task_type", "data.train_data_paths", "data.val_data_paths")
def data_files_given(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if is_training(cfg) and not cfg.data.train_data_paths:
        yield ConfigIssue(
            "data.train_data_paths",
            "training needs at least one training file.",
            "set data.train_data_paths=[PATH.jsonl].",
        )
    if not is_training(cfg) and not cfg.data.val_data_paths:
        yield ConfigIssue(
            "data.val_data_paths",
            "evaluation needs at least one benchmark file.",
            "set data.val_data_paths=[PATH1.jsonl,PATH2.jsonl].",
        )


@rule("data.apply_chat_template", "runner.task_type")
def training_prompts_are_preformatted(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if is_training(cfg) and cfg.data.apply_chat_template:
        yield ConfigIssue(
            "data.apply_chat_template",
            "data.apply_chat_template=true: training prompts are used as written (evaluation may apply the chat "
            "template; rlinf-ext preprocess applies it to training data).",
            "preprocess the data with rlinf-ext preprocess and set data.apply_chat_template=false.",
        )
