"""GPU composition arithmetic (pure, CPU): which GPUs the SGLang engines and the actor get, and the refusals.

Expectations are hand-computed from RLinf 0.3.0's rules (ModelParallelComponentPlacement modes,
PackedPlacementStrategy packing); the GPU launch itself is not verified here (no GPU).
"""

from __future__ import annotations

import sys
from typing import ClassVar

import pytest
from rlinf.scheduler import Cluster
from rlinf.scheduler.worker.worker_group import WorkerGroup
from rlinf.utils.placement import ModelParallelComponentPlacement

from rlinf_ext.config import load_config
from rlinf_ext.protocol.engines import EngineSpec
from rlinf_ext.runner.compose import launch_worker_groups
from rlinf_ext.runner.gpu_groups import GpuLayoutError, gpu_layout, packed_process_gpus
from rlinf_ext.runner.groups import WorkerStartupError
from rlinf_ext.workers.rollout_sglang import SGLangRolloutWorker
from rlinf_ext.workers.rollout_vllm import VLLMRolloutWorker
from tests.support.signature_checks import attributes_of, bind_like, checked_against

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REFERENCE = "qwen2.5-3b-tool-1node"


@pytest.fixture
def ref_cfg(monkeypatch):
    """The reference 8-GPU config (env paths need not exist: nothing is read)."""
    for key, value in {
        "RLINF_EXT_QWEN25_3B": "/models/qwen2.5-3b",
        "RLINF_EXT_SEARCHR1_DATA": "/data/searchr1",
        "RLINF_EXT_RETRIEVER_ADDR": "127.0.0.1:8000",
    }.items():
        monkeypatch.setenv(key, value)
    return load_config(REFERENCE)


def test_packed_process_gpus_matches_rlinf_docstring_examples():
    assert packed_process_gpus(0, 3) == [(0,), (1,), (2,), (3,)]
    assert packed_process_gpus(0, 3, per_process=2) == [(0, 1), (2, 3)]
    assert packed_process_gpus(0, 3, per_process=2, stride=2) == [(0, 2), (1, 3)]
    assert packed_process_gpus(4, 7, per_process=4) == [(4, 5, 6, 7)]
    with pytest.raises(GpuLayoutError, match="cannot be split"):
        packed_process_gpus(0, 2, per_process=2)


def test_reference_config_is_collocated_with_eight_engines_and_eight_actor_ranks(ref_cfg):
    layout = gpu_layout(ref_cfg, 8)
    assert layout.mode == "collocated"
    assert layout.rollout_process_gpus == ((0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,))
    assert layout.rollout_dp_size == 8 and layout.rollout_tp == 1
    assert layout.actor_gpus == tuple(range(8)) and layout.actor_dp_size == 8
    assert "actor: 8 data-parallel process(es) on GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in layout.describe()
    assert "train nothing" not in layout.describe()


def test_collocated_rollout_tp2_packs_pairs(ref_cfg):
    ref_cfg.rollout.tensor_parallel_size = 2
    layout = gpu_layout(ref_cfg, 8)
    assert layout.rollout_process_gpus == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.rollout_dp_size == 4


def test_disaggregated_layout(ref_cfg):
    ref_cfg.cluster.component_placement = {"actor,reward": "0-3", "rollout": "4-7"}
    ref_cfg.rollout.tensor_parallel_size = 2
    layout = gpu_layout(ref_cfg, 8)
    assert layout.mode == "disaggregated"
    assert layout.rollout_process_gpus == ((4, 5), (6, 7))
    assert layout.actor_gpus == (0, 1, 2, 3) and layout.actor_dp_size == 4

    ref_cfg.cluster.component_placement = {"actor": "0", "rollout": "1-7", "reward": "0"}
    ref_cfg.rollout.tensor_parallel_size = 1
    layout = gpu_layout(ref_cfg, 8)
    assert layout.mode == "disaggregated" and layout.rollout_dp_size == 7
    assert layout.rollout_process_gpus[0] == (1,) and layout.actor_dp_size == 1
    assert "actor: 1 data-parallel process(es) on GPUs [0]" in layout.describe()


def test_placement_beyond_the_cluster_is_refused_with_the_key_and_fix(ref_cfg):
    ref_cfg.cluster.component_placement = {"actor,rollout,reward": "0-15"}
    with pytest.raises(GpuLayoutError) as info:
        gpu_layout(ref_cfg, 8)
    text = str(info.value)
    assert "cluster.component_placement.actor,rollout,reward" in text
    assert "reaches rank 15" in text and "8 GPUs" in text and "Fix" in text


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            lambda c: setattr(c.cluster, "component_placement", {"actor,reward": "0-3", "rollout": "2-7"}),
            "overlap partly",
        ),
        (lambda c: setattr(c.cluster, "component_placement", {"actor,rollout": "all"}), "places no 'reward'"),
        (lambda c: setattr(c.actor.model, "tensor_model_parallel_size", 2), "TP=PP=1"),
        (lambda c: setattr(c.rollout, "tensor_parallel_size", 3), "not a multiple of rollout.tensor_parallel_size=3"),
        (lambda c: setattr(c.rollout, "pipeline_parallel_size", 2), "rollout.pipeline_parallel_size=2"),
        (lambda c: setattr(c.rollout, "enforce_eager", True), "rollout.enforce_eager"),
    ],
)
def test_layouts_this_composition_cannot_run_are_refused(ref_cfg, change, needle):
    change(ref_cfg)
    with pytest.raises(GpuLayoutError, match="Fix") as info:
        gpu_layout(ref_cfg, 8)
    assert needle in str(info.value)


def test_engine_spanning_two_nodes_is_refused(ref_cfg):
    ref_cfg.cluster.num_nodes = 2
    ref_cfg.cluster.component_placement = {"actor,reward": "0-5", "rollout": "6-13"}
    ref_cfg.rollout.tensor_parallel_size = 4
    with pytest.raises(GpuLayoutError, match="span nodes"):
        gpu_layout(ref_cfg, 16)
    ref_cfg.cluster.component_placement = {"actor,reward": "0-3", "rollout": "4-11"}
    assert gpu_layout(ref_cfg, 16).rollout_process_gpus == ((4, 5, 6, 7), (8, 9, 10, 11))


def FakeGpuCluster():  # noqa: N802 - stands for RLinf's Cluster, of which launch reads the GPU count only
    return attributes_of(Cluster, num_accelerators=8)


def test_launch_refuses_a_bad_gpu_placement_before_starting_anything(ref_cfg):
    ref_cfg.cluster.component_placement = {"actor,rollout,reward": "0-15"}
    with pytest.raises(WorkerStartupError) as info:
        launch_worker_groups(ref_cfg, FakeGpuCluster())
    assert info.value.component == "placement" and "reaches rank 15" in str(info.value)


def test_launch_names_the_missing_sglang_install(ref_cfg):
    assert "sglang" not in sys.modules  # not installed on CPU machines: the import must stay lazy
    ref_cfg.rollout.rollout_backend = "sglang"
    with pytest.raises(WorkerStartupError) as info:
        launch_worker_groups(ref_cfg, FakeGpuCluster())
    assert info.value.component == "rollout" and "bash scripts/install.sh --sglang" in str(info.value)


class Recorder:
    """Stands in for a Worker class: records create_group args and the launch placement. ``create_group``'s
    arguments go to the real worker class's constructor (RLinf's ``Worker.create_group``), so they are bound to
    it; ``launch`` is RLinf's ``WorkerGroup.launch``, spelled and checked as it."""

    launched: ClassVar[dict] = {}

    def __init__(self, name, real: type):
        self.name, self.real = name, real

    def create_group(self, *args, **kwargs):
        bind_like(self.real, *args, label=f"{self.real.__name__}(...) (its create_group)", **kwargs)
        recorder = self

        class Group:
            @checked_against(WorkerGroup.launch)
            def launch(
                self,
                cluster,
                placement_strategy=None,
                name=None,
                max_concurrency=None,
                isolate_gpu=True,
                catch_system_failure=None,
                disable_distributed_log=False,
            ):
                Recorder.launched[recorder.name] = {
                    "args": args,
                    "kwargs": kwargs,
                    "strategy": placement_strategy,
                    "group_name": name,
                }
                return f"<{recorder.name} group>"

        return Group()


class FakeRLinfPlacement:
    """What launch_gpu_groups reads from RLinf's ModelParallelComponentPlacement (spelled and checked as it)."""

    @checked_against(ModelParallelComponentPlacement.__init__)
    def __init__(self, config, cluster):
        self.config, self.rollout_dp_size, self.is_collocated = config, 8, True
        attributes_of(ModelParallelComponentPlacement, rollout_dp_size=8, is_collocated=True)

    @checked_against(ModelParallelComponentPlacement.get_strategy)
    def get_strategy(self, component_name):
        return f"rlinf-{component_name}-strategy"


def test_gpu_wiring_places_the_sglang_rollout_and_one_actor_process_per_gpu(ref_cfg, monkeypatch):
    from rlinf_ext.runner import gpu_groups

    Recorder.launched = {}
    ref_cfg.rollout.rollout_backend = "sglang"
    monkeypatch.setattr(gpu_groups, "missing_packages", lambda spec, saver: [])  # as on a node with the profile
    monkeypatch.setattr(EngineSpec, "load", lambda spec, part: Recorder("rollout", SGLangRolloutWorker))
    monkeypatch.setattr(gpu_groups, "ModelParallelComponentPlacement", FakeRLinfPlacement)
    monkeypatch.setattr(gpu_groups, "ActorWorker", Recorder("actor", gpu_groups.ActorWorker))
    monkeypatch.setattr(gpu_groups, "RewardWorker", Recorder("reward", gpu_groups.RewardWorker))
    monkeypatch.setattr(gpu_groups, "AgentLoopWorker", Recorder("agent_loop", gpu_groups.AgentLoopWorker))

    groups = launch_worker_groups(ref_cfg, FakeGpuCluster(), total_train_steps=7, search_server_addr="h:1")
    got = Recorder.launched
    assert groups.rollout == "<rollout group>"
    assert groups.placement.rollout_dp_size == 8 and groups.placement.actor_world_size == 8
    assert groups.placement.weight_sync.mode == "paired"  # collocated: each actor rank to the engine on its GPU
    # rollout: the typed config (the SGLang worker derives collocation from it), RLinf's strategy
    assert got["rollout"]["args"] == (ref_cfg,) and got["rollout"]["strategy"] == "rlinf-rollout-strategy"
    # actor: the typed config, one data-parallel process per GPU 0-7
    assert got["actor"]["args"] == (ref_cfg, 7)
    strategy = got["actor"]["strategy"]
    assert (strategy._start_hw_rank, strategy._end_hw_rank, strategy._num_hardware_per_process) == (0, 7, 1)
    # reward and agent loop: CPU processes on node 0, one agent-loop worker per engine
    assert got["reward"]["strategy"]._node_ranks == [0]
    assert got["agent_loop"]["strategy"]._node_ranks == [0] * 8
    assert got["agent_loop"]["kwargs"] == {"search_server_addr": "h:1", "launcher_ip": None}


def test_gpu_wiring_gives_the_vllm_worker_the_experiment_config(ref_cfg, monkeypatch):
    from rlinf_ext.runner import gpu_groups

    Recorder.launched = {}
    ref_cfg.rollout.rollout_backend = "vllm"
    monkeypatch.setattr(gpu_groups, "missing_packages", lambda spec, saver: [])  # as on a node with the gpu extra
    loaded = []
    monkeypatch.setattr(
        EngineSpec,
        "load",
        lambda spec, part: loaded.append((spec.name, part)) or Recorder("rollout", VLLMRolloutWorker),
    )
    monkeypatch.setattr(gpu_groups, "ModelParallelComponentPlacement", FakeRLinfPlacement)
    for name in ("ActorWorker", "RewardWorker", "AgentLoopWorker"):
        monkeypatch.setattr(gpu_groups, name, Recorder(name, getattr(gpu_groups, name)))
    launch_worker_groups(ref_cfg, FakeGpuCluster(), total_train_steps=7)
    rollout = Recorder.launched["rollout"]
    assert rollout["args"] == (ref_cfg,) and rollout["kwargs"] == {"verify_sync": True}
    assert rollout["strategy"] == "rlinf-rollout-strategy" and loaded == [("vllm", "rollout_worker")]


def test_gpu_launch_refuses_a_batch_the_actor_ranks_cannot_share(ref_cfg):
    ref_cfg.data.rollout_batch_size = 12  # 12 prompts over 8 actor GPUs
    with pytest.raises(WorkerStartupError) as info:
        launch_worker_groups(ref_cfg, FakeGpuCluster())
    text = str(info.value)
    assert info.value.component == "actor" and "8 data-parallel processes" in text
    assert "data.rollout_batch_size a multiple of 8" in text and "e.g. 16" in text
