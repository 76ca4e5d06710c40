"""Placement and model-dimension rules: every component placed within the cluster, TP x PP dividing each
component's ranks (``config/placement.py:placements``) and the model's attention heads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from rlinf_ext.config.placement import placements
from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


@rule(
    "cluster.num_nodes",
    "cluster.num_gpus_per_node",
    "cluster.component_placement",
    "runner.task_type",
    "actor.model.tensor_model_parallel_size",
    "actor.model.pipeline_model_parallel_size",
    "rollout.tensor_parallel_size",
    "rollout.pipeline_parallel_size",
)
def placement_fits_cluster(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_nodes < 1 or cfg.cluster.num_gpus_per_node < 0:
        yield ConfigIssue("cluster.num_nodes", "needs >= 1 node and >= 0 GPUs per node.", "fix the cluster profile.")
        return
    yield from placements(cfg)[1]


def model_dims(cfg: ExperimentConfig) -> tuple[int | None, int | None, str]:
    """(attention heads, KV groups, source): from the preset, else from config.json when the model exists."""
    m = cfg.actor.model
    if m.num_attention_heads is not None:
        return m.num_attention_heads, m.num_query_groups or m.num_attention_heads, "actor.model (preset)"
    path = Path(str(cfg.rollout.model.model_path)) / "config.json"
    if path.is_file():
        hf = json.loads(path.read_text())
        heads = hf.get("num_attention_heads")
        return heads, hf.get("num_key_value_heads", heads), str(path)
    return None, None, "unknown"


@rule(
    "actor.model.tensor_model_parallel_size",
    "rollout.tensor_parallel_size",
    "actor.model.num_attention_heads",
    "actor.model.num_query_groups",
)
def tp_divides_heads(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    heads, groups, source = model_dims(cfg)
    if heads is None:
        return
    for key, tp in (
        ("actor.model.tensor_model_parallel_size", cfg.actor.model.tensor_model_parallel_size),
        ("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size),
    ):
        if tp < 1:
            continue
        for what, n in (("attention heads", heads), ("KV groups", groups)):
            if n % tp:
                ok = [d for d in range(1, n + 1) if n % d == 0 and heads % d == 0 and groups % d == 0]
                yield ConfigIssue(
                    key,
                    f"TP={tp} does not divide the model's {n} {what} (from {source}).",
                    f"use a TP in {ok}.",
                )
                break
