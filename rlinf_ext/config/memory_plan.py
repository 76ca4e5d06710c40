"""The per-GPU memory plan of an experiment config: ``rlinf-ext plan`` prints it and ``validate`` refuses a GPU
config whose estimate does not fit the memory a GPU of ``cluster.gpu_memory_gib`` gives CUDA, naming the keys that
would make it fit.

The arithmetic is ``models/memory.py``; this module reads the config into its inputs (model dimensions from the
``actor.model`` preset, else the checkpoint's config.json; a Qwen2.5-VL model's vision tower from its config.json,
else the tower every Qwen2.5-VL size shares) and tries the knobs that lower the peak. The rollout engine is vLLM's
(``rollout.gpu_memory_utilization`` of each of its GPUs: weights, runtime, KV cache, and its CUDA context beside it;
asleep while a collocated actor trains, ``rollout.vllm.sleep_level``) or SGLang's figures, as the engine's entry
says (``EngineSpec.memory_model``). Collocated, the weight sync is a phase of its own (the engine's weights awake
beside the actor's transfer memory), and the host RAM per node is the actor's offloaded parts plus what the sleeping
engines back up. With batches dispatched ahead (``runner.max_staleness = k``), k + 1 batches share the engines
(``format_in_flight``). Disaggregated, an FSDP2 actor's rank 0 gathers the full state in its host RAM for every
sync. Every phase is checked against what the GPU gives CUDA (``capacity``: read on this node's GPU of the
configured kind, else a table value), not against ``cluster.gpu_memory_gib``, its nominal size.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlinf_ext.config.placement import is_collocated, placements
from rlinf_ext.config.rule_registry import is_training, rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.models.dtypes import dtype_of_precision
from rlinf_ext.models.gpu_capacity import GpuCapacity, gpu_capacity, local_gpu_total_bytes
from rlinf_ext.models.memory import (
    GIB,
    ActorMemoryInputs,
    EngineMemory,
    GpuPlan,
    ModelShape,
    SyncTransfer,
    engine_memory,
    plan_gpu,
    rank0_gather_bytes,
    sync_transfer,
    vision_tower_params,
)
from rlinf_ext.models.qwen2 import dims_from_hf_config, load_hf_config_dict
from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.engines import ENGINE_KEY, VLLM, engine_spec, read_key

VL_MODEL_TYPE = "qwen2.5_vl"


def model_shape(cfg: ExperimentConfig) -> tuple[ModelShape | None, str]:
    """(shape, source): the ``actor.model`` preset when complete, else the HF config.json, else (None, why); with
    the vision tower's parameters for a vision-language model."""
    shape, source = _language_model_shape(cfg)
    if shape is None:
        return None, source
    vision = vision_params(cfg, shape.hidden)
    return (replace(shape, vision_params=vision) if vision else shape), source


def _language_model_shape(cfg: ExperimentConfig) -> tuple[ModelShape | None, str]:
    m = cfg.actor.model
    preset = (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.padded_vocab_size)
    if None not in preset:
        groups = m.num_query_groups or m.num_attention_heads
        tied = bool(m.share_embeddings_and_output_weights)  # unknown counts as untied: the larger estimate
        return ModelShape(
            m.num_layers,
            m.hidden_size,
            m.ffn_hidden_size,
            m.num_attention_heads,
            groups,
            m.hidden_size // m.num_attention_heads,
            m.padded_vocab_size,
            tied,
        ), "actor.model (preset)"
    path = Path(str(cfg.rollout.model.model_path)) / "config.json"
    if not path.is_file():
        return (
            None,
            "model dimensions unknown (no complete actor.model preset, no config.json at rollout.model.model_path)",
        )
    try:
        d = dims_from_hf_config(path)
    except (ValueError, KeyError) as exc:
        return None, f"{path}: {exc}"
    return ModelShape(
        d.num_layers,
        d.hidden_size,
        d.ffn_hidden_size,
        d.num_attention_heads,
        d.num_query_groups,
        d.head_dim,
        d.vocab_size,
        d.tie_word_embeddings,
    ), str(path)


def vision_params(cfg: ExperimentConfig, text_hidden: int) -> int:
    """The vision tower's parameters: config.json's ``vision_config`` when the checkpoint is there, else (a
    Qwen2.5-VL preset) the tower every Qwen2.5-VL size shares with ``text_hidden`` as its output; 0 for text."""
    path = Path(str(cfg.rollout.model.model_path)) / "config.json"
    vc = load_hf_config_dict(path).get("vision_config") if path.is_file() else None
    if vc:
        return vision_tower_params(
            depth=int(vc.get("depth", 32)),
            hidden=int(vc.get("hidden_size", 1280)),
            ffn=int(vc.get("intermediate_size", 3420)),
            out_hidden=int(vc.get("out_hidden_size", text_hidden)),
            patch=int(vc.get("patch_size", 14)),
            temporal_patch=int(vc.get("temporal_patch_size", 2)),
            in_channels=int(vc.get("in_channels", 3)),
            spatial_merge=int(vc.get("spatial_merge_size", 2)),
        )
    if str(cfg.rollout.model.model_type) == VL_MODEL_TYPE:
        return vision_tower_params(out_hidden=text_hidden)
    return 0


def memory_inputs(cfg: ExperimentConfig) -> tuple[ActorMemoryInputs | None, str]:
    shape, source = model_shape(cfg)
    if shape is None:
        return None, source
    plans, _ = placements(cfg)
    actor = plans.get("actor")
    a, m, gpu = cfg.actor, cfg.actor.model, cfg.cluster.num_gpus_per_node > 0
    if a.training_backend == "fsdp":  # FSDP2: sharded state; HF activation checkpointing = full, per layer
        checkpointing = a.fsdp_config.gradient_checkpointing
        return ActorMemoryInputs(
            shape,
            seq_length=int(cfg.runner.seq_length),
            micro_batch_size=int(cfg.algorithm.training_batch_size_per_gpu),
            precision=str(m.precision),
            device="cuda" if gpu else "cpu",
            data_parallel=max(actor.dp if actor is not None else 1, 1),
            optimizer=str(a.optim.optimizer),
            reference_model=cfg.algorithm.kl_beta > 0,
            flash_attention=gpu,
            recompute_granularity="full" if checkpointing else None,
            recompute_method="uniform" if checkpointing else None,
            recompute_num_layers=1 if checkpointing else None,
            logprob_chunk_tokens=int(a.logprob_chunk_tokens),
            entropy=cfg.algorithm.entropy_bonus > 0,
            fsdp=True,
        ), source
    return ActorMemoryInputs(
        shape,
        seq_length=int(cfg.runner.seq_length),
        micro_batch_size=int(cfg.algorithm.training_batch_size_per_gpu),
        precision=str(m.precision),
        device="cuda" if gpu else "cpu",
        data_parallel=max(actor.dp if actor is not None else 1, 1),
        distributed_optimizer=bool(a.optim.use_distributed_optimizer),
        optimizer=str(a.optim.optimizer),
        reference_model=cfg.algorithm.kl_beta > 0,
        flash_attention=gpu and a.spec_name == "decoder_gpt",
        recompute_granularity=m.recompute_granularity,
        recompute_method=m.recompute_method,
        recompute_num_layers=m.recompute_num_layers,
        logprob_chunk_tokens=int(a.logprob_chunk_tokens),
        entropy=cfg.algorithm.entropy_bonus > 0,
        critic=cfg.algorithm.adv_type == "gae" and cfg.critic.use_critic_model,
    ), source


def capacity(cfg: ExperimentConfig) -> GpuCapacity:
    """What one GPU of ``cluster.gpu_memory_gib`` gives CUDA: read on this node's GPU when it is of that kind (on
    GPU clusters only), else the table's figure."""
    measured = local_gpu_total_bytes() if cfg.cluster.num_gpus_per_node > 0 else None
    return gpu_capacity(cfg.cluster.gpu_memory_gib, measured)


def gpu_words(cfg: ExperimentConfig) -> str:
    """The GPU the phases are checked against, in messages."""
    c = capacity(cfg)
    return f"the {c.usable_gib:.2f} GiB a GPU of cluster.gpu_memory_gib={c.nominal_gib:g} gives CUDA ({c.source})"


def rollout_dtype_bytes(cfg: ExperimentConfig) -> int:
    return dtype_of_precision(str(cfg.rollout.model.precision), "rollout.model.precision").itemsize


def engine_plan(cfg: ExperimentConfig, shape: ModelShape, fraction: float | None = None) -> EngineMemory:
    """One rollout engine's GPU: ``rollout.gpu_memory_utilization`` (or ``fraction``) of what it gives CUDA, the
    model in ``rollout.model.precision`` over ``rollout.tensor_parallel_size`` GPUs, asleep at
    ``rollout.vllm.sleep_level``."""
    r = cfg.rollout
    return engine_memory(
        shape,
        gpu_bytes=capacity(cfg).usable_bytes,
        fraction=float(r.gpu_memory_utilization if fraction is None else fraction),
        dtype_bytes=rollout_dtype_bytes(cfg),
        tensor_parallel=int(r.tensor_parallel_size),
        backend=memory_model(cfg),
        sleep_level=int(r.vllm.sleep_level),
    )


def memory_model(cfg: ExperimentConfig) -> str:
    """The engine's memory model in ``models/memory.py`` (its entry's; vLLM's for an engine never planned on GPUs)."""
    return engine_spec(cfg).memory_model or VLLM


def sync_route(cfg: ExperimentConfig) -> str:
    """The collocated sync's route: vLLM's packed CUDA IPC (``ipc``), or RLinf's paired buckets (SGLang)."""
    return engine_spec(cfg).collocated_route


def transfer_plan(cfg: ExperimentConfig, x: ActorMemoryInputs) -> SyncTransfer:
    return sync_transfer(x.shape, route=sync_route(cfg), dtype_bytes=rollout_dtype_bytes(cfg), fsdp=x.fsdp)


def gpu_plan(cfg: ExperimentConfig, x: ActorMemoryInputs, fraction: float | None = None, **offload: bool) -> GpuPlan:
    """The plan of ``cfg`` for the actor inputs ``x``, with ``fraction`` for ``rollout.gpu_memory_utilization`` and
    ``offload`` flags for ``actor.offload_*`` when given."""
    a = cfg.actor
    flags = dict(offload_weight=a.offload_weight, offload_optimizer=a.offload_optimizer, offload_grad=a.offload_grad)
    flags.update(offload)
    collocated = is_collocated(cfg)
    # disaggregated, FSDP2's rank 0 sends alone and first gathers the full state; collocated, each rank streams to
    # its own engine a tensor at a time
    rank0 = rank0_gather_bytes(x.shape, rollout_dtype_bytes(cfg)) if x.fsdp and not collocated else 0
    return plan_gpu(
        x,
        engine=engine_plan(cfg, x.shape, fraction),
        collocated=collocated,
        transfer=transfer_plan(cfg, x),
        rank0_host=rank0,
        **flags,
    )


def ranks_per_node(cfg: ExperimentConfig, component: str) -> int:
    """GPUs of ``component`` on its busiest node (each holds one rank, or one engine's share)."""
    plans, _ = placements(cfg)
    plan = plans.get(component)
    gpn = max(cfg.cluster.num_gpus_per_node, 1)
    if plan is None:
        return 0
    counts: dict[int, int] = {}
    for rank in plan.ranks:
        counts[rank // gpn] = counts.get(rank // gpn, 0) + 1
    return max(counts.values(), default=0)


def fixes(cfg: ExperimentConfig, x: ActorMemoryInputs) -> list[str]:
    """Changes that each make the plan fit, with the estimate they give (cheapest first)."""
    tries: list[tuple[str, ActorMemoryInputs, dict]] = [
        (
            "actor.model.recompute_granularity=full actor.model.recompute_method=uniform "
            "actor.model.recompute_num_layers=1",
            replace(x, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
            {},
        ),
        ("actor.optim.use_distributed_optimizer=true", replace(x, distributed_optimizer=True), {}),
        ("actor.spec_name=decoder_gpt", replace(x, flash_attention=True), {}),
        ("actor.logprob_chunk_tokens=256", replace(x, logprob_chunk_tokens=min(256, x.logprob_chunk_tokens)), {}),
        (
            "actor.offload_weight=true actor.offload_optimizer=true actor.offload_grad=true",
            x,
            dict(offload_weight=True, offload_optimizer=True, offload_grad=True),
        ),
        ("algorithm.training_batch_size_per_gpu=1", replace(x, micro_batch_size=1), {}),
    ]
    out = []
    for text, changed, offload in tries:
        if changed == x and not offload:
            continue
        plan = gpu_plan(cfg, changed, **offload)
        if plan.fits:
            out.append(f"{text} (est. {plan.peak / GIB:.1f} GiB)")
    longest = _longest_fitting_sequence(cfg, x)
    if longest:
        out.append(
            f"runner.seq_length={longest} (est. {gpu_plan(cfg, replace(x, seq_length=longest)).peak / GIB:.1f} GiB)"
        )
    util = _largest_rollout_fraction(cfg, x)
    if util is not None and util < cfg.rollout.gpu_memory_utilization:
        out.append(f"rollout.gpu_memory_utilization={util:.2f}")
    return out


def _longest_fitting_sequence(cfg: ExperimentConfig, x: ActorMemoryInputs) -> int | None:
    best = None
    for seq in range(256, x.seq_length, 256):
        if gpu_plan(cfg, replace(x, seq_length=seq)).fits:
            best = seq
    return best


def _largest_rollout_fraction(cfg: ExperimentConfig, x: ActorMemoryInputs) -> float | None:
    """The largest ``rollout.gpu_memory_utilization`` whose rollout phase fits, when the current one does not;
    None unless the whole plan then fits (the training and sync phases do not depend on the fraction) with room
    for one sequence in the KV cache."""
    plan = gpu_plan(cfg, x)
    if plan.rollout_phase <= plan.gpu_bytes:
        return None
    spare = plan.gpu_bytes - (plan.rollout_phase - plan.engine.budget)
    if spare <= 0.1 * plan.gpu_bytes:
        return None
    util = round(spare / plan.gpu_bytes - 0.005, 2)
    fitted = gpu_plan(cfg, x, fraction=util)
    return util if fitted.fits and fitted.engine.kv_tokens >= int(cfg.runner.seq_length) else None


def engine_concurrency(cfg: ExperimentConfig) -> tuple[str, int]:
    """(key, value): how many sequences one rollout engine generates at once."""
    key = engine_spec(cfg).concurrency_key
    return key, int(read_key(cfg, key))


def format_in_flight(cfg: ExperimentConfig) -> list[str]:
    """Batches dispatched ahead (``runner.max_staleness = k``): the k + 1 batches in flight against what each engine
    runs at once and, on GPUs (vLLM), what its KV cache holds; a line marked ``!`` when they do not all fit (beyond
    the concurrency they wait in the engine's queue: slower, not wrong; beyond the KV cache vLLM preempts them, and
    a preempted turn a sync passes resumes on the new weights: a trajectory of two versions)."""
    k = cfg.runner.max_staleness
    if k <= 0 or not is_training(cfg):
        return []
    plans, issues = placements(cfg)
    engines = max(plans["rollout"].dp, 1) if "rollout" in plans and not issues else 1
    live = (k + 1) * cfg.data.rollout_batch_size * cfg.algorithm.group_size
    per_engine = -(-live // engines)
    key, concurrency = engine_concurrency(cfg)
    lines = [
        "",
        f"batches in flight (runner.max_staleness={k}): {k + 1} x {cfg.data.rollout_batch_size} prompts x "
        f"{cfg.algorithm.group_size} = {live} trajectories, {per_engine} per engine ({engines} engine(s))",
        f"  {key}={concurrency} per engine",
    ]
    if per_engine > concurrency:
        lines.append(
            f"  ! {per_engine - concurrency} trajectories per engine wait in its queue; {key}={per_engine} "
            "runs them all at once"
        )
    if cfg.cluster.num_gpus_per_node > 0 and memory_model(cfg) == VLLM and not placements(cfg)[1]:
        shape, _ = model_shape(cfg)
        if shape is not None:
            sequences = engine_plan(cfg, shape).kv_tokens // max(int(cfg.runner.seq_length), 1)
            lines.append(f"  KV cache: {sequences} sequences of runner.seq_length per engine")
            if sequences < min(per_engine, concurrency):
                lines.append(
                    f"  ! the KV cache holds {sequences} full sequences for {min(per_engine, concurrency)} "
                    "running ones: vLLM preempts the longest, and a sync does not wait for a preempted "
                    "turn, which resumes on the new weights: its tokens span two versions "
                    f"({mk.TRAJECTORIES_TWO_VERSIONS}); raise rollout.gpu_memory_utilization or lower the "
                    "concurrency"
                )
    return lines


def format_memory(cfg: ExperimentConfig) -> list[str]:
    """The plan's memory section: the actor's items, the engine's share, both phases against the GPU, what would
    make it fit."""
    if cfg.cluster.num_gpus_per_node <= 0 or not is_training(cfg):
        return []
    if placements(cfg)[1]:
        return ["", "memory per GPU: not estimated (fix the placement first)"]
    x, source = memory_inputs(cfg)
    if x is None:
        return ["", f"memory per GPU: not estimated ({source})"]
    plan = gpu_plan(cfg, x)
    recompute = x.recompute_granularity or "off"
    if x.recompute_granularity == "full":
        recompute += f"/{x.recompute_method}/{x.recompute_num_layers}"
    vision = f" + vision tower {x.shape.vision_params / 1e9:.2f}B" if x.shape.vision_params else ""
    engine = (
        f"FSDP2 over DP {x.data_parallel}, {'SDPA' if x.flash_attention else 'eager'} attention"
        if x.fsdp
        else f"DP {x.data_parallel}{', distributed optimizer' if x.distributed_optimizer else ''}, "
        f"{'TE' if x.flash_attention else 'local'} layers"
    )
    lines = [
        "",
        f"memory per GPU (estimate, GiB; {source}; {x.shape.params / 1e9:.2f}B params{vision}, "
        f"{x.precision}, {engine}, recompute {recompute}, "
        f"seq_length {x.seq_length} x micro-batch {x.micro_batch_size}):",
    ]
    gpu = f"{plan.gpu_bytes / GIB:.2f}"
    rows = [(f"actor {k}", f"{v / GIB:7.2f}") for k, v in plan.actor.items.items()]
    rows.append(("actor peak (training step)", f"{plan.actor.peak / GIB:7.2f}"))
    rows += _engine_rows(cfg, x)
    if plan.collocated:
        rows.append(("GPU, training phase (actor peak + engine asleep)", f"{plan.training_phase / GIB:7.2f} of {gpu}"))
        rows += _sync_rows(cfg, x, plan)
        rows.append(
            (
                "GPU, rollout phase (engine + its CUDA context + what the actor keeps)",
                f"{plan.rollout_phase / GIB:7.2f} of {gpu}",
            )
        )
        rows += _host_ram_rows(cfg, x, plan)
    else:
        rows.append(("actor GPUs", f"{plan.training_phase / GIB:7.2f} of {gpu}"))
        rows.append(("rollout GPUs", f"{plan.rollout_phase / GIB:7.2f} of {gpu}"))
        if plan.rank0_host:
            cast = "" if rollout_dtype_bytes(cfg) == 4 else f" + its {cfg.rollout.model.precision} cast"
            rows.append(
                (
                    f"host RAM, actor rank 0: the weight sync's full-state gather (fp32{cast})",
                    f"{plan.rank0_host / GIB:7.2f}",
                )
            )
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    lines.append(f"  fits {gpu_words(cfg)}: {'yes' if plan.fits and _engine_fits(cfg, x) else 'NO'}")
    if not plan.fits:
        lines += [f"  would fit with: {f}" for f in fixes(cfg, x)] or ["  no single change makes it fit"]
    elif not _engine_fits(cfg, x):
        lines.append(f"  would fit with: {_engine_fix(cfg, x)}")
    return lines


def _engine_rows(cfg: ExperimentConfig, x: ActorMemoryInputs) -> list[tuple[str, str]]:
    """The engine's share of one of its GPUs: what its fraction holds (vLLM), or the fraction and workspace."""
    e, r = engine_plan(cfg, x.shape), cfg.rollout
    tp = f", TP {r.tensor_parallel_size}" if r.tensor_parallel_size > 1 else ""
    rows = [
        (
            f"engine share ({engine_spec(cfg).name}: {r.gpu_memory_utilization:g} x {e.gpu_bytes / GIB:.2f}{tp})",
            f"{e.budget / GIB:7.2f}",
        ),
        (f"  engine weights ({r.model.precision})", f"{e.weights / GIB:7.2f}"),
    ]
    if memory_model(cfg) == VLLM:
        seqs = e.kv_tokens / max(int(cfg.runner.seq_length), 1)
        rows += [
            ("  engine runtime (activations, CUDA graphs)", f"{e.runtime / GIB:7.2f}"),
            (
                f"  engine KV cache ({e.kv_tokens:,} tokens = {seqs:.0f} x runner.seq_length)",
                f"{max(e.kv_cache, 0) / GIB:7.2f}",
            ),
        ]
        rows.append(("engine CUDA context (beside its share)", f"{e.outside / GIB:7.2f}"))
    else:
        rows.append(("  engine workspace (outside its fraction)", f"{e.outside / GIB:7.2f}"))
    if is_collocated(cfg):
        level = f", sleep level {r.vllm.sleep_level}" if memory_model(cfg) == VLLM else ""
        rows.append((f"engine asleep (while the actor trains{level})", f"{e.asleep / GIB:7.2f}"))
    return rows


def _sync_rows(cfg: ExperimentConfig, x: ActorMemoryInputs, plan: GpuPlan) -> list[tuple[str, str]]:
    """The collocated weight sync: the engine awake without its KV cache, the actor's kept parts and transfer."""
    e, t, gpu = plan.engine, plan.transfer, plan.gpu_bytes / GIB
    vllm = sync_route(cfg) == "ipc"
    buffer = "vLLM's packed IPC buffer" if vllm else "a bucket and the tensors packed into it"
    conversion = (
        "the largest parameter gathered whole in fp32 and cast"
        if x.fsdp
        else "2 x the largest tensor: brought over, cast or split"
    )
    rows = [
        (
            "GPU, weight-sync phase (engine without its KV cache + actor + transfer)",
            f"{plan.sync_phase / GIB:7.2f} of {gpu:.2f}",
        ),
        ("  engine asleep + weights + runtime pools", f"{(e.asleep + e.weights + e.runtime) / GIB:7.2f}"),
    ]
    if vllm:
        rows.append(
            ("  engine update copies (a chunk's clones, layers being loaded)", f"{e.update_transient / GIB:7.2f}")
        )
    rows.append(("  actor kept (CUDA context + parts not offloaded)", f"{plan.actor_kept / GIB:7.2f}"))
    if plan.sync_onloaded:
        rows.append(("  actor weight shards brought back for the gathers", f"{plan.sync_onloaded / GIB:7.2f}"))
    rows += [
        (f"  actor transfer buffers ({buffer})", f"{t.buffers / GIB:7.2f}"),
        (f"  actor conversion tensors ({conversion})", f"{t.conversion / GIB:7.2f}"),
    ]
    return rows


def _host_ram_rows(cfg: ExperimentConfig, x: ActorMemoryInputs, plan: GpuPlan) -> list[tuple[str, str]]:
    """Host RAM per node, collocated: the actor's offloaded parts (while the engines run) and the sleeping engines'
    backups (while the actor trains), summed: an upper bound, pinned copies may stay allocated between phases."""
    actors, engines = ranks_per_node(cfg, "actor"), ranks_per_node(cfg, "rollout")
    e = plan.engine
    if memory_model(cfg) != VLLM:
        asleep = "engines asleep (SGLang keeps no copy)"
    elif cfg.rollout.vllm.sleep_level == 1:
        asleep = "engines asleep (level 1 backs up weights, runtime and CUDA-graph pools)"
    else:
        asleep = "engines asleep (level 2 backs up the runtime and CUDA-graph pools)"
    total = actors * plan.actor_host + engines * e.host_asleep
    return [
        (
            (
                f"host RAM per node, actor offload: {actors} x {plan.actor_host / GIB:.2f} (actor.offload_*; "
                "gradients are freed)"
            ),
            f"{actors * plan.actor_host / GIB:7.2f}",
        ),
        (
            f"host RAM per node, {asleep}: {engines} x {e.host_asleep / GIB:.2f}",
            f"{engines * e.host_asleep / GIB:7.2f}",
        ),
        ("host RAM per node, both (their sum: an upper bound)", f"{total / GIB:7.2f}"),
    ]


def _engine_fits(cfg: ExperimentConfig, x: ActorMemoryInputs) -> bool:
    """vLLM's KV cache holds at least one sequence of ``runner.seq_length`` (its max_model_len) tokens."""
    if memory_model(cfg) != VLLM:  # SGLang's KV cache is not modelled
        return True
    return engine_plan(cfg, x.shape).kv_tokens >= int(cfg.runner.seq_length)


def _engine_fix(cfg: ExperimentConfig, x: ActorMemoryInputs) -> str:
    need = engine_plan(cfg, x.shape).min_fraction(int(cfg.runner.seq_length))
    out = []
    if need <= 0.95:
        out.append(f"rollout.gpu_memory_utilization={need:.2f}")
    out.append(
        f"rollout.tensor_parallel_size={2 * int(cfg.rollout.tensor_parallel_size)} (the weights split over "
        "twice the GPUs)"
    )
    return ", or ".join(out)


@rule(
    "cluster.num_gpus_per_node",
    "cluster.gpu_memory_gib",
    "cluster.component_placement",
    "runner.task_type",
    "runner.seq_length",
    "algorithm.training_batch_size_per_gpu",
    "algorithm.kl_beta",
    "actor.model.precision",
    "actor.model.recompute_granularity",
    "actor.model.recompute_method",
    "actor.model.recompute_num_layers",
    "actor.spec_name",
    "actor.optim.use_distributed_optimizer",
    "actor.logprob_chunk_tokens",
    "rollout.gpu_memory_utilization",
    "actor.offload_weight",
    "actor.offload_optimizer",
    "actor.offload_grad",
    "actor.training_backend",
    "actor.fsdp_config.gradient_checkpointing",
    ENGINE_KEY,
    "rollout.vllm.sleep_level",
    "rollout.model.precision",
    "rollout.tensor_parallel_size",
)
def actor_fits_gpu_memory(cfg):
    if cfg.cluster.num_gpus_per_node <= 0 or not is_training(cfg) or placements(cfg)[1]:
        return
    x, _ = memory_inputs(cfg)
    if x is None:
        return
    plan = gpu_plan(cfg, x)
    if plan.fits:
        return
    phases = {"training": plan.training_phase, "weight-sync": plan.sync_phase, "rollout": plan.rollout_phase}
    over = [name for name, peak in phases.items() if peak > plan.gpu_bytes]
    phase = max(over, key=phases.get)
    key, detail, _ = _phase_terms(cfg, x, plan, phase)
    also = [f"the {name} phase ({phases[name] / GIB:.1f} GiB)" for name in over if name != phase]
    found = fixes(cfg, x)
    # a weight sync that does not fit needs its own remedy: the fraction does not change it
    fallback = _phase_terms(cfg, x, plan, "weight-sync" if "weight-sync" in over else phase)[2]
    yield ConfigIssue(
        key,
        f"the estimated peak per GPU is {plan.peak / GIB:.2f} GiB in the {phase} phase ({detail}), over "
        f"{gpu_words(cfg)}" + (f"; so is {' and '.join(also)}" if also else "") + " (see `rlinf-ext plan`).",
        ("any of: " + "; ".join(found)) if found else fallback,
    )


def _phase_terms(cfg: ExperimentConfig, x: ActorMemoryInputs, plan: GpuPlan, phase: str) -> tuple[str, str, str]:
    """(key, what the phase holds, the remedy when no single change fits) of a phase over the GPU."""
    if phase == "training":
        detail = f"actor step {plan.actor.peak / GIB:.1f} GiB at runner.seq_length={x.seq_length}" + (
            f" + {plan.engine.asleep / GIB:.1f} GiB the sleeping engine keeps" if plan.collocated else ""
        )
        return (
            "runner.seq_length",
            detail,
            (
                "lower runner.seq_length and turn on full recompute, the distributed "
                "optimizer and offload together, or use GPUs with more memory (cluster.gpu_memory_gib)."
            ),
        )
    if phase == "rollout":
        detail = (
            f"the engine's {cfg.rollout.gpu_memory_utilization:g} x {plan.gpu_bytes / GIB:.2f} GiB + its "
            "CUDA context" + (f" + {plan.actor_kept / GIB:.1f} GiB the actor keeps" if plan.collocated else "")
        )
        return (
            "rollout.gpu_memory_utilization",
            detail,
            (
                "lower rollout.gpu_memory_utilization together with "
                "offloading the actor (actor.offload_*), or use GPUs with more memory (cluster.gpu_memory_gib)."
            ),
        )
    a, t = cfg.actor, plan.transfer
    off = [
        k
        for k, on in (
            ("actor.offload_weight", a.offload_weight),
            ("actor.offload_optimizer", a.offload_optimizer),
            ("actor.offload_grad", a.offload_grad),
        )
        if not on
    ]
    detail = (
        f"the engine's weights and runtime awake for the update, {plan.engine.updating / GIB:.1f} GiB with its "
        f"copies (KV cache asleep) + {plan.actor_kept / GIB:.1f} GiB the actor keeps"
        + (f" + {plan.sync_onloaded / GIB:.1f} GiB weight shards it gathers from" if plan.sync_onloaded else "")
        + f" + {t.total / GIB:.1f} GiB its transfer memory (buffers {t.buffers / GIB:.1f}, conversion "
        f"{t.conversion / GIB:.1f})"
    )
    remedy = (
        (f"offload the actor ({', '.join(f'{k}=true' for k in off)}), " if off else "")
        + "split the engine's weights over more GPUs (rollout.tensor_parallel_size), smaller transfer buckets "
        "(models/memory.py BUCKET_BYTES), or GPUs with more memory (cluster.gpu_memory_gib); a lower "
        "rollout.gpu_memory_utilization does not help: the KV cache is asleep during the sync."
    )
    return (off[0] if off else "rollout.tensor_parallel_size"), detail, remedy


@rule(
    "cluster.num_gpus_per_node",
    "cluster.gpu_memory_gib",
    "runner.task_type",
    "runner.seq_length",
    ENGINE_KEY,
    "rollout.gpu_memory_utilization",
    "rollout.tensor_parallel_size",
    "rollout.model.precision",
    "rollout.model.model_type",
)
def engine_has_room_for_kv_cache(cfg):
    """vLLM refuses to start when its fraction of the GPU, after the weights and its runtime, cannot cache one
    sequence of its max_model_len (``runner.seq_length``): caught here, before the launch."""
    if cfg.cluster.num_gpus_per_node <= 0 or not is_training(cfg) or placements(cfg)[1]:
        return
    x, _ = memory_inputs(cfg)
    if x is None or _engine_fits(cfg, x):
        return
    e = engine_plan(cfg, x.shape)
    yield ConfigIssue(
        "rollout.gpu_memory_utilization",
        f"vLLM takes rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization:g} of "
        f"{gpu_words(cfg)} ({e.budget / GIB:.1f} GiB): its weights ({e.weights / GIB:.1f} GiB) "
        f"and runtime (~{e.runtime / GIB:.1f} GiB) leave {max(e.kv_cache, 0) / GIB:.2f} GiB of KV cache, less than one "
        f"sequence of runner.seq_length={cfg.runner.seq_length} tokens "
        f"({cfg.runner.seq_length * e.kv_per_token / GIB:.2f} GiB): the engine would not start.",
        f"set {_engine_fix(cfg, x)}.",
    )
