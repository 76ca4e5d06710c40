"""Cross-field rules of an experiment config. Each rule returns issues (key, reason, fix); none raises.

`skip` holds dotted keys whose value already failed the structural check: a rule reading one of them is not
run, so one mistake is reported once.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Callable, Iterable

from rlinf_ext.config.placement import COMPONENTS, ComponentPlan, PlacementError, parse_ranks, split_components
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

Rule = Callable[[ExperimentConfig], Iterable[ConfigIssue]]
_RULES: list[tuple[tuple[str, ...], Rule]] = []


def rule(*reads: str) -> Callable[[Rule], Rule]:
    """Register a rule with the keys it reads (a rule is skipped when one of them is invalid)."""

    def deco(fn: Rule) -> Rule:
        _RULES.append((reads, fn))
        return fn

    return deco


def _is_grpo(cfg: ExperimentConfig) -> bool:
    return cfg.algorithm.adv_type in ("grpo", "grpo_dynamic")


def _training(cfg: ExperimentConfig) -> bool:
    return cfg.runner.task_type == "reasoning"


# ------------------------------------------------------------------------------------------ generation
@rule("algorithm.sampling_params.stop", "rollout.detokenize")
def stop_needs_detokenize(cfg):
    if cfg.algorithm.sampling_params.stop and not cfg.rollout.detokenize:
        yield ConfigIssue(
            "rollout.detokenize",
            "stop strings are set (algorithm.sampling_params.stop) but the engine does not detokenize, so it "
            "cannot see them and generation runs to EOS.",
            "set rollout.detokenize=true (or clear algorithm.sampling_params.stop).",
        )


@rule("agentloop.agent", "algorithm.recompute_logprobs")
def agent_needs_recompute(cfg):
    if cfg.agentloop.agent == "searchr1" and not cfg.algorithm.recompute_logprobs:
        yield ConfigIssue(
            "algorithm.recompute_logprobs",
            "the Search-R1 agent re-tokenises observations and cut generations, so the engine's log-probs do not "
            "match the trained tokens.",
            "set algorithm.recompute_logprobs=true.",
        )


@rule("runner.seq_length", "data.max_prompt_length")
def seq_longer_than_prompt(cfg):
    if cfg.runner.seq_length <= cfg.data.max_prompt_length:
        yield ConfigIssue(
            "runner.seq_length",
            f"runner.seq_length ({cfg.runner.seq_length}) must be greater than data.max_prompt_length "
            f"({cfg.data.max_prompt_length}); nothing would be left for the response.",
            f"raise runner.seq_length above {cfg.data.max_prompt_length} or lower data.max_prompt_length.",
        )


@rule("algorithm.adv_type", "algorithm.group_size", "runner.task_type")
def group_size_fits_task(cfg):
    gs = cfg.algorithm.group_size
    if gs < 1:
        yield ConfigIssue("algorithm.group_size", f"must be >= 1, got {gs}.", "set algorithm.group_size to 1 or more.")
    elif _training(cfg) and _is_grpo(cfg) and gs <= 1:
        yield ConfigIssue(
            "algorithm.group_size",
            f"GRPO ({cfg.algorithm.adv_type}) compares responses within a group; group_size={gs} gives zero advantages.",
            "set algorithm.group_size to 2 or more (the reference uses 4).",
        )
    elif cfg.runner.task_type == "reasoning_eval" and gs != 1:
        yield ConfigIssue(
            "algorithm.group_size",
            f"evaluation (runner.task_type=reasoning_eval) scores one response per question, got group_size={gs}.",
            "set algorithm.group_size=1.",
        )


@rule("runner.task_type", "data.train_data_paths", "data.val_data_paths")
def data_files_given(cfg):
    if _training(cfg) and not cfg.data.train_data_paths:
        yield ConfigIssue(
            "data.train_data_paths",
            "training needs at least one training file.",
            "set data.train_data_paths=[PATH.jsonl].",
        )
    if not _training(cfg) and not cfg.data.val_data_paths:
        yield ConfigIssue(
            "data.val_data_paths",
            "evaluation needs at least one benchmark file.",
            "set data.val_data_paths=[PATH1.jsonl,PATH2.jsonl].",
        )


@rule(
    "runner.seq_length",
    "data.max_prompt_length",
    "agentloop.response_length_total",
    "algorithm.sampling_params.max_new_tokens",
)
def response_fits_sequence(cfg):
    room = cfg.runner.seq_length - cfg.data.max_prompt_length
    total = cfg.agentloop.response_length_total
    if room > 0 and total > room:
        yield ConfigIssue(
            "agentloop.response_length_total",
            f"a response of {total} tokens does not fit runner.seq_length - data.max_prompt_length = {room}.",
            f"set agentloop.response_length_total<={room} or raise runner.seq_length.",
        )
    elif room > 0 and cfg.algorithm.sampling_params.max_new_tokens > total:
        yield ConfigIssue(
            "algorithm.sampling_params.max_new_tokens",
            f"one turn ({cfg.algorithm.sampling_params.max_new_tokens} tokens) exceeds the whole response budget "
            f"agentloop.response_length_total={total}.",
            f"set algorithm.sampling_params.max_new_tokens<={total}.",
        )


@rule("tools.search.topk")
def search_topk_positive(cfg):
    if cfg.tools.search.topk < 1:
        yield ConfigIssue(
            "tools.search.topk", f"must be >= 1, got {cfg.tools.search.topk}.", "set tools.search.topk=3."
        )


@rule("retrieval.launch", "retrieval.index_dir", "retrieval.corpus_path", "tools.search.server_addr")
def retrieval_source(cfg):
    if cfg.tools.search.backend != "local":
        return
    if cfg.retrieval.launch:
        for key in ("index_dir", "corpus_path"):
            if getattr(cfg.retrieval, key) is None:
                yield ConfigIssue(
                    f"retrieval.{key}",
                    "retrieval.launch is true but no value is set, so the server cannot start.",
                    f"set retrieval.{key}=PATH.",
                )
    elif cfg.tools.search.server_addr is None:
        yield ConfigIssue(
            "tools.search.server_addr",
            "no retrieval server: tools.search.server_addr is null and retrieval.launch is false.",
            "set tools.search.server_addr=HOST:PORT or retrieval.launch=true.",
        )


@rule("cluster.num_gpus_per_node", "rollout.rollout_backend")
def backend_fits_hardware(cfg):
    if cfg.cluster.num_gpus_per_node == 0 and cfg.rollout.rollout_backend != "hf":
        yield ConfigIssue(
            "rollout.rollout_backend",
            f"{cfg.rollout.rollout_backend} needs GPUs but the cluster has none (cluster.num_gpus_per_node=0).",
            "set rollout.rollout_backend=hf for a CPU run, or use a GPU cluster profile.",
        )


@rule("algorithm.n_minibatches", "algorithm.training_batch_size_per_gpu", "data.rollout_batch_size")
def positive_counts(cfg):
    for key, value in (
        ("algorithm.n_minibatches", cfg.algorithm.n_minibatches),
        ("algorithm.training_batch_size_per_gpu", cfg.algorithm.training_batch_size_per_gpu),
        ("data.rollout_batch_size", cfg.data.rollout_batch_size),
    ):
        if value < 1:
            yield ConfigIssue(key, f"must be >= 1, got {value}.", f"set {key} to 1 or more.")


# ------------------------------------------------------------------------------------------ placement
_PARALLEL_KEYS = {
    "actor": ("actor.model.tensor_model_parallel_size", "actor.model.pipeline_model_parallel_size"),
    "rollout": ("rollout.tensor_parallel_size", "rollout.pipeline_parallel_size"),
}


def placements(cfg: ExperimentConfig) -> tuple[dict[str, ComponentPlan], list[ConfigIssue]]:
    """component -> plan, with issues for bad ranks, unknown components and TP x PP mismatches."""
    cluster = cfg.cluster
    gpn = cluster.num_gpus_per_node
    total = cluster.num_nodes * gpn if gpn > 0 else None
    parallel = {
        "actor": (cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size),
        "rollout": (cfg.rollout.tensor_parallel_size, cfg.rollout.pipeline_parallel_size),
    }
    plans: dict[str, ComponentPlan] = {}
    issues: list[ConfigIssue] = []
    for key, spec in cluster.component_placement.items():
        dotted = f"cluster.component_placement.{key}"
        if isinstance(spec, dict):
            issues.append(
                ConfigIssue(
                    dotted,
                    "node-group placement mappings are not supported by rlinf_ext's planner.",
                    "give GPU ranks directly, e.g. '0-7'.",
                )
            )
            continue
        try:
            ranks = parse_ranks(spec, total)
        except PlacementError as exc:
            issues.append(ConfigIssue(dotted, exc.reason, exc.fix))
            continue
        for name in split_components(key):
            if name not in COMPONENTS:
                close = difflib.get_close_matches(name, COMPONENTS, n=2)
                fix = (
                    f"did you mean {' or '.join(close)}?" if close else f"use component names {', '.join(COMPONENTS)}."
                )
                issues.append(ConfigIssue(dotted, f"unknown component '{name}'.", fix))
                continue
            if name in plans:
                issues.append(ConfigIssue(dotted, f"component '{name}' is placed twice.", "place each component once."))
                continue
            tp, pp = parallel.get(name, (1, 1))
            plans[name] = ComponentPlan(name, tuple(ranks), gpn, tp, pp)
    for name, (tp, pp) in parallel.items():
        plan = plans.get(name)
        if plan is None:
            continue
        tp_key, pp_key = _PARALLEL_KEYS[name]
        if tp < 1 or pp < 1:
            key = tp_key if tp < 1 else pp_key
            issues.append(ConfigIssue(key, f"TP={tp}, PP={pp}: both must be >= 1.", f"set {key}=1 or more."))
        elif plan.world_size % (tp * pp):
            issues.append(
                ConfigIssue(
                    tp_key,
                    f"TP x PP = {tp} x {pp} = {tp * pp} does not divide the {plan.world_size} ranks of {name} "
                    f"({spec_of(cfg, name)}).",
                    f"choose TP x PP dividing {plan.world_size}, or place {name} on a multiple of {tp * pp} GPUs.",
                )
            )
    required = ("actor", "rollout", "reward") if _training(cfg) else ("rollout", "reward")
    for name in required:
        if name not in plans and not any(name in split_components(k) for k in cluster.component_placement):
            issues.append(
                ConfigIssue(
                    "cluster.component_placement",
                    f"component '{name}' has no placement.",
                    "add it, e.g. cluster.component_placement={'actor,rollout,reward': all}.",
                )
            )
    return plans, issues


def spec_of(cfg: ExperimentConfig, name: str) -> str:
    for key, spec in cfg.cluster.component_placement.items():
        if name in split_components(key):
            return f"{key}: {spec}"
    return "unplaced"


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
def placement_fits_cluster(cfg):
    if cfg.cluster.num_nodes < 1 or cfg.cluster.num_gpus_per_node < 0:
        yield ConfigIssue("cluster.num_nodes", "needs >= 1 node and >= 0 GPUs per node.", "fix the cluster profile.")
        return
    yield from placements(cfg)[1]


@rule(
    "data.rollout_batch_size",
    "algorithm.group_size",
    "algorithm.n_minibatches",
    "algorithm.training_batch_size_per_gpu",
    "cluster.component_placement",
    "cluster.num_gpus_per_node",
    "cluster.num_nodes",
    "actor.model.tensor_model_parallel_size",
    "actor.model.pipeline_model_parallel_size",
    "runner.task_type",
)
def batch_divides(cfg):
    if not _training(cfg):
        return
    rbs, gs, nmb = cfg.data.rollout_batch_size, cfg.algorithm.group_size, cfg.algorithm.n_minibatches
    mbs = cfg.algorithm.training_batch_size_per_gpu
    if min(rbs, gs, nmb, mbs) < 1:
        return  # reported by other rules
    total = rbs * gs
    if total % nmb:
        yield ConfigIssue(
            "algorithm.n_minibatches",
            f"data.rollout_batch_size x algorithm.group_size = {rbs} x {gs} = {total} trajectories do not split "
            f"into {nmb} equal minibatches.",
            f"choose n_minibatches dividing {total}, or change data.rollout_batch_size.",
        )
        return
    if cfg.cluster.num_gpus_per_node < 0 or cfg.cluster.num_nodes < 1:
        return
    plans, placement_issues = placements(cfg)
    actor = plans.get("actor")
    if actor is None or placement_issues or actor.dp < 1:
        return
    if rbs % actor.dp:
        # each data-parallel actor rank trains on whole GRPO groups (engines/data_parallel.share_of)
        yield ConfigIssue(
            "data.rollout_batch_size",
            f"{rbs} prompts (GRPO groups) per step do not split over the actor's data-parallel size {actor.dp}.",
            f"make data.rollout_batch_size a multiple of {actor.dp} (e.g. data.rollout_batch_size={-(-rbs // actor.dp) * actor.dp}).",
        )
        return
    per_minibatch = total // nmb
    if total % actor.dp or per_minibatch % (actor.dp * mbs):
        yield ConfigIssue(
            "data.rollout_batch_size",
            f"{rbs} prompts x group {gs} = {total} trajectories -> {nmb} minibatches of {per_minibatch}, which "
            f"do not split over data-parallel size {actor.dp} x micro-batch {mbs}.",
            f"make rollout_batch_size x group_size / n_minibatches a multiple of {actor.dp * mbs} "
            f"(e.g. data.rollout_batch_size={_next_batch(rbs, gs, nmb * actor.dp * mbs)}).",
        )


def _next_batch(rbs: int, gs: int, unit: int) -> int:
    """Smallest rollout_batch_size >= rbs with rbs * gs a multiple of unit."""
    step = unit // math.gcd(gs, unit)
    return -(-rbs // step) * step


# ------------------------------------------------------------------------------------------ model dims
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
def tp_divides_heads(cfg):
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


# ------------------------------------------------------------------------------------------ paths
def path_issues(cfg: ExperimentConfig) -> list[ConfigIssue]:
    """Existence of every path the run reads (only with check_paths=True)."""
    from rlinf_ext.config.schema import REQUIRED

    checks: list[tuple[str, object, str]] = [("rollout.model.model_path", cfg.rollout.model.model_path, "dir")]
    checks += [(f"data.train_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.train_data_paths))]
    checks += [(f"data.val_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.val_data_paths))]
    if cfg.actor.megatron.use_hf_ckpt and _training(cfg):
        checks.append(
            ("actor.megatron.ckpt_convertor.hf_model_path", cfg.actor.megatron.ckpt_convertor.hf_model_path, "dir")
        )
    if cfg.retrieval.launch:
        checks.append(("retrieval.corpus_path", cfg.retrieval.corpus_path, "file"))
        if cfg.retrieval.pages_path is not None:
            checks.append(("retrieval.pages_path", cfg.retrieval.pages_path, "file"))
        if cfg.retrieval.retriever != "bm25":
            checks.append(("retrieval.model_path", cfg.retrieval.model_path, "dir"))
    if cfg.runner.resume_dir not in (None, "auto"):
        checks.append(("runner.resume_dir", cfg.runner.resume_dir, "dir"))
    issues = []
    for key, value, kind in checks:
        if value is None or value == REQUIRED:
            continue
        p = Path(str(value))
        ok = p.is_dir() if kind == "dir" else p.is_file()
        if not ok:
            what = "directory" if kind == "dir" else "file"
            issues.append(
                ConfigIssue(
                    key, f"{what} {p} does not exist.", f"create it or point {key.split('[')[0]} at an existing {what}."
                )
            )
    return issues


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def run_rules(cfg: ExperimentConfig, skip: set[str] = frozenset(), check_paths: bool = False) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    for reads, fn in _RULES:
        if any(k in skip for k in reads):
            continue
        issues.extend(fn(cfg))
    if check_paths:
        issues += path_issues(cfg)
    return issues
