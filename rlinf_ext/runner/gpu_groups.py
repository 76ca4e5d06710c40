"""Worker groups on a GPU cluster (written, NOT GPU-verified).

- rollout: the engine's worker (``protocol/engines.py``), one engine per ``rollout.tensor_parallel_size`` GPUs,
  placed by RLinf's ``ModelParallelComponentPlacement`` as RLinf's runners do (``config/placement.py:mode_of_ranks``);
- actor: our Megatron-core ``ActorWorker``, one data-parallel process per actor GPU (``PackedPlacementStrategy``,
  TP=PP=1, nccl all-reduce: ``training/data_parallel.py``, tested with gloo on CPU only);
- reward and agent-loop workers: CPU processes on node 0 (``NodePlacementStrategy``).

``gpu_layout`` is the pure arithmetic (which GPUs each process gets), unit-tested on CPU; it mirrors RLinf's mode
rules and packing and refuses what this composition cannot run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.scheduler import PackedPlacementStrategy
from rlinf.utils.placement import ModelParallelComponentPlacement

from rlinf_ext.config import to_dictconfig
from rlinf_ext.config.placement import COLLOCATED, PlacementError, PlacementMode, component_ranks, mode_of_ranks
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.engines import ENGINE_KEY, engine_spec, missing_packages
from rlinf_ext.runner.groups import (
    Placement,
    WorkerGroups,
    WorkerStartupError,
    check_actor_data_parallel,
    cpu_strategy,
    launch_group,
)
from rlinf_ext.sync.weight_sync import SyncRoutes
from rlinf_ext.training.data_parallel import unsupported_model_parallelism
from rlinf_ext.workers.actor import ActorWorker
from rlinf_ext.workers.agent_loop import AgentLoopWorker
from rlinf_ext.workers.reward import RewardWorker


class GpuLayoutError(ValueError):
    """The placement cannot run on this GPU cluster; the message names the key and the fix."""


@dataclass(frozen=True)
class GpuLayout:
    num_gpus: int
    gpus_per_node: int
    mode: PlacementMode
    rollout_gpus: tuple[int, ...]  # the placement's rollout GPUs
    rollout_tp: int
    rollout_process_gpus: tuple[tuple[int, ...], ...]  # GPUs of each SGLang engine process (= rollout DP rank)
    actor_gpus: tuple[int, ...]  # the placement's actor GPUs: one data-parallel actor process on each

    @property
    def rollout_dp_size(self) -> int:
        return len(self.rollout_process_gpus)

    @property
    def actor_dp_size(self) -> int:
        """Actor processes (= data-parallel ranks, TP=PP=1 each)."""
        return len(self.actor_gpus)

    def describe(self) -> str:
        engines = ", ".join("+".join(map(str, p)) for p in self.rollout_process_gpus)
        gpus = ", ".join(map(str, self.actor_gpus))
        return (
            f"{self.mode}: {self.rollout_dp_size} SGLang engine(s) on GPUs [{engines}] (TP={self.rollout_tp}); "
            f"actor: {self.actor_dp_size} data-parallel process(es) on GPUs [{gpus}] (TP=PP=1 each); "
            "reward + agent loop: CPU of node 0"
        )


def packed_process_gpus(start: int, end: int, per_process: int = 1, stride: int = 1) -> list[tuple[int, ...]]:
    """GPUs of each process of ``PackedPlacementStrategy(start, end, per_process, stride)`` (RLinf's packing:
    each process starts at the lowest unused GPU and takes ``per_process`` GPUs ``stride`` apart)."""
    total = end - start + 1
    if total % (per_process * stride):
        raise GpuLayoutError(
            f"{total} GPUs ({start}-{end}) cannot be split into processes of {per_process} GPU(s) with stride {stride}."
        )
    used: set[int] = set()
    out: list[tuple[int, ...]] = []
    while len(used) < total:
        first = min(g for g in range(start, end + 1) if g not in used)
        gpus = tuple(range(first, first + per_process * stride, stride))
        used.update(gpus)
        out.append(gpus)
    return out


def gpu_layout(cfg: ExperimentConfig, num_gpus: int, gpus_per_node: int | None = None) -> GpuLayout:
    """Which GPUs the rollout engines and the actor get on a cluster of ``num_gpus`` GPUs (pure)."""
    if num_gpus <= 0:
        raise GpuLayoutError("gpu_layout needs a cluster with GPUs; CPU clusters use NodePlacementStrategy.")
    gpn = int(gpus_per_node or cfg.cluster.num_gpus_per_node or num_gpus)
    try:
        ranks = component_ranks(cfg.cluster.component_placement, num_gpus)
    except PlacementError as exc:
        raise GpuLayoutError(str(exc)) from exc
    for name in ("actor", "rollout", "reward"):  # RLinf's ModelParallelComponentPlacement requires all three
        if name not in ranks:
            raise GpuLayoutError(
                f"cluster.component_placement places no '{name}'. Fix: add it, e.g. 'actor,rollout,reward: all' "
                "(the reward worker itself runs on CPU)."
            )
    problem = unsupported_model_parallelism(
        cfg.actor.model.tensor_model_parallel_size, cfg.actor.model.pipeline_model_parallel_size
    )
    if problem is not None:
        raise GpuLayoutError(problem)
    tp, pp = cfg.rollout.tensor_parallel_size, cfg.rollout.pipeline_parallel_size
    if pp != 1:
        raise GpuLayoutError(f"rollout.pipeline_parallel_size={pp}: SGLang engines run TP only. Fix: set it to 1.")
    rollout, actor = ranks["rollout"], ranks["actor"]
    if len(rollout) % tp:
        raise GpuLayoutError(
            f"the rollout has {len(rollout)} GPUs, not a multiple of rollout.tensor_parallel_size={tp}. "
            f"Fix: give the rollout a multiple of {tp} GPUs or change the TP size."
        )
    try:
        mode = mode_of_ranks(actor, rollout)
    except PlacementError as exc:
        raise GpuLayoutError(str(exc)) from exc
    if mode == COLLOCATED and cfg.rollout.enforce_eager:
        raise GpuLayoutError(
            "rollout.enforce_eager=true with the actor and rollout collocated: SGLang can only release its "
            "memory for the actor with CUDA graphs on (memory saver). Fix: set rollout.enforce_eager=false."
        )
    # RLinf: collocated strides the rollout by actor_tp // rollout_tp (= 1 here, the actor runs TP=1)
    processes = packed_process_gpus(rollout[0], rollout[-1], per_process=tp, stride=1)
    for gpus in processes:
        if len({g // gpn for g in gpus}) != 1:
            raise GpuLayoutError(
                f"a TP={tp} SGLang engine would span nodes (GPUs {list(gpus)}, {gpn} GPUs per node). "
                "Fix: start the rollout range on a node boundary or lower rollout.tensor_parallel_size."
            )
    return GpuLayout(num_gpus, gpn, mode, tuple(rollout), tp, tuple(processes), tuple(actor))


def weight_sync_routes(layout: GpuLayout) -> SyncRoutes:
    """Who sends to whom: collocated, each actor rank to the engine on its own GPU; disaggregated, actor rank 0 to
    every engine (``sync/weight_sync.py``). The transport of each is the engine's (``EngineSpec.route``)."""
    mode = "paired" if layout.mode == "collocated" else "broadcast"
    return SyncRoutes(mode, layout.actor_dp_size, layout.rollout_dp_size, layout.rollout_tp)


def launch_gpu_groups(
    cfg: ExperimentConfig,
    cluster: Any,
    *,
    total_train_steps: int,
    verify_sync: bool = True,
    search_server_addr: Any = None,
    launcher_ip: str | None = None,
) -> WorkerGroups:
    """Launch the GPU composition (module docstring); start-up failures raise ``WorkerStartupError``."""
    try:
        layout = gpu_layout(cfg, int(cluster.num_accelerators))
    except GpuLayoutError as exc:
        raise WorkerStartupError("placement", exc) from exc
    check_actor_data_parallel(cfg, layout.actor_dp_size)
    engine = engine_spec(cfg)
    missing = missing_packages(engine, saver=layout.mode == COLLOCATED and not cfg.rollout.enforce_eager)
    if not engine.runs_on(gpu=True) or missing:
        raise WorkerStartupError(
            "rollout",
            f"{ENGINE_KEY}={engine.name} cannot run on these GPUs"
            + (
                f" ({', '.join(missing)} missing). Fix: on every GPU node, {engine.install_fix}."
                if missing
                else f". Fix: set {ENGINE_KEY}=vllm."
            ),
        )
    rollout_cls = engine.load("rollout_worker")
    print(f"[groups] GPU layout: {layout.describe()}", flush=True)
    rlinf_cfg = to_dictconfig(cfg)  # RLinf's placement reads a DictConfig
    try:
        placement = ModelParallelComponentPlacement(rlinf_cfg, cluster)
    except Exception as exc:
        raise WorkerStartupError(
            "placement", f"RLinf's ModelParallelComponentPlacement refused the config: {exc}"
        ) from exc
    if placement.rollout_dp_size != layout.rollout_dp_size or placement.is_collocated != (layout.mode == "collocated"):
        raise WorkerStartupError(
            "placement",
            f"RLinf's placement (rollout DP {placement.rollout_dp_size}, collocated="
            f"{placement.is_collocated}) disagrees with rlinf_ext's layout ({layout.describe()}).",
        )
    groups: dict[str, Any] = {}
    # both rollout workers read the experiment config (the SGLang one derives collocation from the placement)
    launch_group(
        groups,
        cluster,
        "rollout",
        rollout_cls,
        cfg.rollout.group_name,
        placement.get_strategy("rollout"),
        cfg,
        verify_sync=verify_sync,
    )
    # one process per actor GPU (RLinf's packing, as its MegatronActor with TP=PP=1): data-parallel ranks
    launch_group(
        groups,
        cluster,
        "actor",
        ActorWorker,
        cfg.actor.group_name,
        PackedPlacementStrategy(layout.actor_gpus[0], layout.actor_gpus[-1]),
        cfg,
        total_train_steps,
    )
    launch_group(groups, cluster, "reward", RewardWorker, cfg.reward.group_name, cpu_strategy(1), cfg)
    launch_group(
        groups,
        cluster,
        "agent_loop",
        AgentLoopWorker,
        cfg.agentloop.group_name,
        cpu_strategy(layout.rollout_dp_size),
        cfg,
        search_server_addr=search_server_addr,
        launcher_ip=launcher_ip,
    )
    return WorkerGroups(
        placement=Placement(
            rollout_dp_size=layout.rollout_dp_size,
            agent_loop_world_size=layout.rollout_dp_size,
            actor_world_size=layout.actor_dp_size,
            weight_sync=weight_sync_routes(layout),
        ),
        **groups,
    )
