"""Cross-field rules of an experiment config (generation, data, tools, retrieval) and ``run_rules``, which runs
every registered rule (``config/rule_registry.py``). Each rule returns issues (key, reason, fix); none raises.

`skip` holds dotted keys whose value already failed the structural check: a rule reading one of them is not
run, so one mistake is reported once.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

# imported for their @rule registrations
from rlinf_ext.agent.registry import AGENTS, agent_spec
from rlinf_ext.config import memory_plan, rules_actor, rules_placement, rules_support  # noqa: F401
from rlinf_ext.config.placement import PlacementError, component_ranks
from rlinf_ext.config.rule_registry import is_grpo, is_training, registered_rules, rule
from rlinf_ext.config.schema import REQUIRED, ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


# ------------------------------------------------------------------------------------------ generation
@rule("algorithm.sampling_params.stop", "rollout.detokenize")
def stop_needs_detokenize(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.algorithm.sampling_params.stop and not cfg.rollout.detokenize:
        yield ConfigIssue(
            "rollout.detokenize",
            "stop strings are set (algorithm.sampling_params.stop) but the engine does not detokenize, so it "
            "cannot see them and generation runs to EOS.",
            "set rollout.detokenize=true (or clear algorithm.sampling_params.stop).",
        )


@rule("rollout.return_logprobs", "rollout.rollout_backend", "algorithm.sampling_params.top_p",
      "algorithm.sampling_params.top_k", "algorithm.sampling_params.repetition_penalty")
def engine_logprobs_mean_the_actors(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Engine log-probs mean log-softmax(logits / temperature), as the actor recomputes them. vLLM returns them
    after its processors (``generation/vllm_wire.py:LOGPROBS_MODE``), so with top-k / top-p / a repetition
    penalty on they would be those of the truncated, penalised distribution instead."""
    sp = cfg.algorithm.sampling_params
    on = [k for k, off in (("top_p", sp.top_p >= 1.0), ("top_k", sp.top_k is None or sp.top_k <= 0),
                           ("repetition_penalty", sp.repetition_penalty == 1.0)) if not off]
    if cfg.rollout.return_logprobs and cfg.rollout.rollout_backend == "vllm" and sp.do_sample and on:
        yield ConfigIssue(
            "rollout.return_logprobs",
            f"vLLM would return log-probs after {', '.join('algorithm.sampling_params.' + k for k in on)}, not those "
            "of logits / temperature that the actor computes, so the kept engine log-probs would not be comparable.",
            "set rollout.return_logprobs=false (training uses the actor's recomputed log-probs), or turn "
            + " and ".join(on) + " off.",
        )


@rule("agentloop.agent", "algorithm.recompute_logprobs")
def logprobs_are_recomputed(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """The trainer always recomputes the old log-probs: every agent's loop re-tokenises tool text."""
    if not cfg.algorithm.recompute_logprobs:
        yield ConfigIssue(
            "algorithm.recompute_logprobs",
            f"the {agent_spec(cfg).title} loop re-tokenises tool observations into the response, so the engine's "
            "sampled log-probs do not cover the trained tokens; the trainer always recomputes them with the actor.",
            "set algorithm.recompute_logprobs=true (the only supported value).",
        )


@rule("runner.seq_length", "data.max_prompt_length")
def seq_longer_than_prompt(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.runner.seq_length <= cfg.data.max_prompt_length:
        yield ConfigIssue(
            "runner.seq_length",
            f"runner.seq_length ({cfg.runner.seq_length}) must be greater than data.max_prompt_length "
            f"({cfg.data.max_prompt_length}); nothing would be left for the response.",
            f"raise runner.seq_length above {cfg.data.max_prompt_length} or lower data.max_prompt_length.",
        )


@rule("algorithm.adv_type", "algorithm.group_size", "runner.task_type")
def group_size_fits_task(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    gs = cfg.algorithm.group_size
    if gs < 1:
        yield ConfigIssue("algorithm.group_size", f"must be >= 1, got {gs}.", "set algorithm.group_size to 1 or more.")
    elif is_training(cfg) and is_grpo(cfg) and gs <= 1:
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


@rule("agentloop.agent", "reward.reward_type", "data.type", "reward.scoring", "rollout.model.model_type")
def agent_parts_agree(cfg):
    """An agent is one choice (agentloop.agent); its data reader, reward and model kind follow from the registry."""
    spec = agent_spec(cfg)
    for key, value, wanted in (("data.type", cfg.data.type, spec.data_type),
                               ("reward.reward_type", cfg.reward.reward_type, spec.reward_type)):
        if value != wanted:
            yield ConfigIssue(key, f"agentloop.agent={spec.name} ({spec.title}) reads its data and scores with "
                              f"{wanted}, but {key}={value}.", f"set {key}={wanted} (or choose another agent: "
                              f"{sorted(AGENTS)}).")
    if cfg.reward.reward_type == spec.reward_type and cfg.reward.scoring not in spec.reward_scorings:
        yield ConfigIssue("reward.scoring", f"the {spec.reward_type} reward scores {list(spec.reward_scorings)}, got "
                          f"{cfg.reward.scoring}.", f"set reward.scoring to one of {list(spec.reward_scorings)}.")
    vl = cfg.rollout.model.model_type == "qwen2.5_vl"
    if spec.vision != vl:
        need = "a vision-language model (qwen2.5_vl)" if spec.vision else "a text model"
        yield ConfigIssue("rollout.model.model_type", f"{spec.title} runs on {need}, but rollout.model.model_type="
                          f"{cfg.rollout.model.model_type}.", "use a model of the agent's kind, or choose the other "
                          "agent.")


@rule("rollout.model.model_type", "actor.training_backend", "runner.task_type", "actor.fsdp_config.cpu_offload")
def vl_model_needs_fsdp(cfg):
    """Megatron-core 0.16.1 has no Qwen2.5-VL; the HF actor loads only Qwen2.5-VL."""
    vl, fsdp = cfg.rollout.model.model_type == "qwen2.5_vl", cfg.actor.training_backend == "fsdp"
    if vl and not fsdp and is_training(cfg):
        yield ConfigIssue("actor.training_backend", "rollout.model.model_type=qwen2.5_vl trains with the FSDP2 actor "
                          "(Megatron-core 0.16.1 has no Qwen2.5-VL model).", "set actor.training_backend=fsdp.")
    if fsdp and not vl:
        yield ConfigIssue("actor.training_backend", f"the fsdp actor trains Qwen2.5-VL models only, but "
                          f"rollout.model.model_type={cfg.rollout.model.model_type}.",
                          "set actor.training_backend=megatron for text models (or model_type=qwen2.5_vl).")
    if fsdp and cfg.actor.fsdp_config.cpu_offload:
        yield ConfigIssue("actor.fsdp_config.cpu_offload", "FSDP2's CPUOffloadPolicy (parameters kept on CPU, the "
                          "optimizer step on CPU) is not implemented for the FSDP2 actor.",
                          "set actor.fsdp_config.cpu_offload=false; actor.offload_weight / offload_optimizer free "
                          "the GPUs for a collocated rollout between phases.")


@rule("agentloop.agent", "algorithm.sampling_params.stop")
def stops_hold_the_action_tags(cfg):
    """The loop acts when the engine stops at an action's closing tag. Every request carries the agent's stops
    (the loop adds them); a configured list that leaves one out says something the run does not do."""
    spec = agent_spec(cfg)
    configured = cfg.algorithm.sampling_params.stop or []
    missing = [t for t in spec.stops if t not in configured]
    if configured and missing:
        yield ConfigIssue("algorithm.sampling_params.stop", f"{spec.title} turns end at {list(spec.stops)}; missing "
                          f"{missing}.", f"add {missing} to algorithm.sampling_params.stop.")


@rule("agentloop.agent", "agentloop.mmsearch.max_gen_round", "agentloop.mmsearch.image_search_limit",
      "agentloop.mmsearch.text_search_limit")
def mm_search_limits_fit_the_rounds(cfg):
    """Each search takes a round and the answer needs one more: a limit at or above max_gen_round is unreachable."""
    mm = cfg.agentloop.mmsearch
    if not agent_spec(cfg).image_search or mm.max_gen_round < 1:
        return
    for key, limit in (("image_search_limit", mm.image_search_limit), ("text_search_limit", mm.text_search_limit)):
        if limit < 0 or limit > mm.max_gen_round - 1:
            yield ConfigIssue(f"agentloop.mmsearch.{key}", f"{limit} searches cannot fit max_gen_round="
                              f"{mm.max_gen_round} (each search takes a round, the answer one more).",
                              f"set agentloop.mmsearch.{key} between 0 and {max(mm.max_gen_round - 1, 0)}.")


@rule("data.image_min_pixels", "data.image_max_pixels", "tools.image_search.thumbnail_min_pixels",
      "tools.image_search.thumbnail_max_pixels")
def image_pixel_bounds(cfg):
    for lo_key, hi_key, lo, hi in (
        ("data.image_min_pixels", "data.image_max_pixels", cfg.data.image_min_pixels, cfg.data.image_max_pixels),
        ("tools.image_search.thumbnail_min_pixels", "tools.image_search.thumbnail_max_pixels",
         cfg.tools.image_search.thumbnail_min_pixels, cfg.tools.image_search.thumbnail_max_pixels),
    ):
        if lo < 28 * 28:
            yield ConfigIssue(lo_key, f"{lo} pixels is below one 28x28 block (784).", f"set {lo_key}>=784.")
        elif hi < lo:
            yield ConfigIssue(hi_key, f"{hi} is below {lo_key}={lo}.", f"set {hi_key}>={lo}.")


@rule("agentloop.agent", "tools.image_search.backend", "tools.image_search.cache_path", "agentloop.mmsearch.max_gen_round")
def image_search_source(cfg):
    if not agent_spec(cfg).image_search:
        return
    if cfg.tools.image_search.backend != "dummy" and not cfg.tools.image_search.cache_path:
        yield ConfigIssue("tools.image_search.cache_path", f"backend {cfg.tools.image_search.backend} reads a cache, "
                          "but no path is set.", "set tools.image_search.cache_path=DIR (FVQA_Cache) or FILE.pkl.")
    if cfg.agentloop.mmsearch.max_gen_round < 1:
        yield ConfigIssue("agentloop.mmsearch.max_gen_round", "must be >= 1.", "set agentloop.mmsearch.max_gen_round=3.")


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


@rule(
    "runner.seq_length",
    "data.max_prompt_length",
    "agentloop.response_length_total",
    "algorithm.sampling_params.max_new_tokens",
)
def response_fits_sequence(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
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
def search_topk_positive(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.tools.search.topk < 1:
        yield ConfigIssue(
            "tools.search.topk", f"must be >= 1, got {cfg.tools.search.topk}.", "set tools.search.topk=3."
        )


@rule("retrieval.launch", "retrieval.index_dir", "retrieval.corpus_path", "tools.search.server_addr")
def retrieval_source(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
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


# The SGLang profile: the release the SGLang code is written against (generation/sglang_*.py,
# workers/rollout_sglang.py) and the command that installs it (setup.py's `sglang` extra)
SGLANG_VERSION = "0.5.23"
SGLANG_INSTALL = "bash scripts/install.sh --sglang"


def installed_sglang() -> str | None:
    """The installed sglang's version, read from its metadata (importing sglang initialises CUDA); None if absent."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@rule("rollout.rollout_backend")
def sglang_profile_installed(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """``rollout_backend: sglang`` needs the SGLang profile (sglang 0.5.23 on torch 2.14.1) on this machine: the
    SGLang code speaks that release's ``Engine`` API, and the vLLM profile (torch 2.13.0) cannot hold it."""
    if cfg.rollout.rollout_backend != "sglang":
        return
    found = installed_sglang()
    if found != SGLANG_VERSION:
        have = "sglang is not installed here" if found is None else f"sglang {found} is installed here"
        yield ConfigIssue(
            "rollout.rollout_backend",
            f"sglang needs the SGLang profile (sglang {SGLANG_VERSION} on torch 2.14.1, transformers 5.19.0), but "
            f"{have}.",
            f"on the GPU node run `{SGLANG_INSTALL}` (into its own virtual environment: it replaces vLLM's torch "
            "2.13.0), or set rollout.rollout_backend=vllm on GPUs (rollout.rollout_backend=hf on CPU).",
        )


@rule("runner.task_type", "cluster.num_nodes", "cluster.num_gpus_per_node", "cluster.component_placement",
      "actor.offload_weight", "actor.offload_optimizer")
def collocated_needs_offload(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """Collocated GPUs: the rollout engine takes rollout.gpu_memory_utilization of each GPU back at every rollout
    while the actor still holds whatever it did not offload (fp32 weights, optimizer state: tens of GB for 3B).
    Both actors offload (Megatron's buffers; the FSDP2 actor's shards, training/fsdp_policy_offload.py)."""
    gpn = cfg.cluster.num_gpus_per_node
    if not is_training(cfg) or gpn < 1:
        return
    try:
        ranks = component_ranks(cfg.cluster.component_placement, cfg.cluster.num_nodes * gpn)
    except PlacementError:  # reported by the placement rule
        return
    if "actor" not in ranks or ranks.get("actor") != ranks.get("rollout"):
        return
    missing = [f"actor.{k}" for k in ("offload_weight", "offload_optimizer") if not getattr(cfg.actor, k)]
    if missing:
        yield ConfigIssue(
            missing[0],
            f"{' and '.join(missing)} false with the actor and the rollout on the same GPUs (collocated): the "
            f"rollout engine takes back rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} of every GPU at each "
            "rollout while the actor still holds that state, so the GPUs run out of memory.",
            f"set {' '.join(k + '=true' for k in missing)}, or place actor and rollout on disjoint GPUs.",
        )


@rule("runner.task_type", "cluster.num_nodes", "cluster.num_gpus_per_node", "cluster.component_placement",
      "actor.training_backend", "actor.offload_weight", "actor.offload_optimizer", "actor.offload_grad")
def offload_has_something_to_free(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """actor.offload_* moves actor state off the GPUs it shares with the rollout; elsewhere it would do nothing."""
    flags = [f"actor.{k}" for k in ("offload_weight", "offload_optimizer", "offload_grad") if getattr(cfg.actor, k)]
    gpn = cfg.cluster.num_gpus_per_node
    if not flags or not is_training(cfg):
        return
    fix = f"set {' '.join(k + '=false' for k in flags)}"
    if gpn < 1:
        yield ConfigIssue(flags[0], f"{', '.join(flags)} true on a CPU cluster (cluster.num_gpus_per_node=0): there is "
                          "no GPU memory to free, so nothing would be offloaded.", fix + ".")
        return
    try:
        ranks = component_ranks(cfg.cluster.component_placement, cfg.cluster.num_nodes * gpn)
    except PlacementError:  # reported by the placement rule
        return
    if not set(ranks.get("actor", [])) & set(ranks.get("rollout", [])):
        yield ConfigIssue(flags[0], f"{', '.join(flags)} true with the actor and the rollout on disjoint GPUs "
                          "(disaggregated): the runner offloads only for a rollout on the actor's GPUs, so nothing "
                          "would be offloaded.", fix + " (or collocate actor and rollout).")


@rule("actor.megatron.ckpt_convertor.hf_model_path", "rollout.model.model_path", "runner.task_type")
def actor_starts_from_the_rollout_model(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    hf = cfg.actor.megatron.ckpt_convertor.hf_model_path
    if is_training(cfg) and hf is not None and str(hf) != str(cfg.rollout.model.model_path):
        yield ConfigIssue(
            "actor.megatron.ckpt_convertor.hf_model_path",
            f"{hf} differs from rollout.model.model_path={cfg.rollout.model.model_path}: the actor starts from "
            "rollout.model.model_path (converted to Megatron in memory), so this path would be ignored.",
            "remove it (it defaults to rollout.model.model_path), or point rollout.model.model_path at that model.",
        )


@rule("cluster.num_gpus_per_node", "rollout.rollout_backend")
def backend_fits_hardware(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_gpus_per_node == 0 and cfg.rollout.rollout_backend == "sglang":
        yield ConfigIssue(
            "rollout.rollout_backend",
            f"{cfg.rollout.rollout_backend} needs GPUs but the cluster has none (cluster.num_gpus_per_node=0).",
            "set rollout.rollout_backend=hf for a CPU run, or use a GPU cluster profile.",
        )


@rule("algorithm.n_minibatches", "algorithm.training_batch_size_per_gpu", "data.rollout_batch_size")
def positive_counts(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    for key, value in (
        ("algorithm.n_minibatches", cfg.algorithm.n_minibatches),
        ("algorithm.training_batch_size_per_gpu", cfg.algorithm.training_batch_size_per_gpu),
        ("data.rollout_batch_size", cfg.data.rollout_batch_size),
    ):
        if value < 1:
            yield ConfigIssue(key, f"must be >= 1, got {value}.", f"set {key} to 1 or more.")


# ------------------------------------------------------------------------------------------ paths
def path_issues(cfg: ExperimentConfig) -> list[ConfigIssue]:
    """Existence of every path the run reads (only with check_paths=True)."""
    checks: list[tuple[str, object, str]] = [("rollout.model.model_path", cfg.rollout.model.model_path, "dir")]
    checks += [(f"data.train_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.train_data_paths))]
    checks += [(f"data.val_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.val_data_paths))]
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
    for reads, fn in registered_rules():
        if any(k in skip for k in reads):
            continue
        issues.extend(fn(cfg))
    if check_paths:
        issues += path_issues(cfg)
    return issues
