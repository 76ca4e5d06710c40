"""Collocated or disaggregated: the one definition (config/placement.py:mode_of_ranks, placement_mode), on
hand-written rank lists and on configs, and validation refusing a partial overlap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlinf_ext.config import check_config
from rlinf_ext.config.placement import PlacementError, is_collocated, mode_of_ranks, placement_mode

pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


@pytest.mark.parametrize(
    "actor, rollout, mode",
    [
        ([0, 1, 2, 3], [0, 1, 2, 3], "collocated"),  # the same GPUs
        ([0, 1], [2, 3, 4, 5], "disaggregated"),  # disjoint
        ([4, 5, 6, 7], [0, 1, 2, 3], "disaggregated"),  # disjoint, the actor above
        ([0], [0], "collocated"),
        (None, [0, 1], "disaggregated"),  # no actor (evaluation)
        ([], [0, 1], "disaggregated"),
        ([0, 1], None, "disaggregated"),
    ],
)
def test_mode_of_ranks(actor, rollout, mode):
    assert mode_of_ranks(actor, rollout) == mode


@pytest.mark.parametrize("actor, rollout", [([0, 1, 2, 3], [2, 3, 4, 5]), ([0, 1, 2, 3], [0, 1]), ([1], [0, 1])])
def test_a_partial_overlap_is_refused(actor, rollout):
    with pytest.raises(PlacementError, match="overlap partly") as info:
        mode_of_ranks(actor, rollout)
    assert "equal or disjoint" in info.value.fix


def _cfg(gpus_per_node: int, placement: dict, num_nodes: int = 1):
    return SimpleNamespace(
        cluster=SimpleNamespace(num_nodes=num_nodes, num_gpus_per_node=gpus_per_node, component_placement=placement)
    )


def test_placement_mode_of_a_config():
    assert placement_mode(_cfg(8, {"actor,rollout,reward": "all"})) == "collocated"
    assert placement_mode(_cfg(4, {"actor": "0-3", "rollout,reward": "all"})) == "collocated"  # all = 0-3
    assert placement_mode(_cfg(8, {"actor,reward": "0-3", "rollout": "4-7"})) == "disaggregated"
    assert placement_mode(_cfg(8, {"rollout,reward": "all"})) == "disaggregated"  # evaluation: no actor
    assert is_collocated(_cfg(8, {"actor,rollout,reward": "all"}))
    assert not is_collocated(_cfg(8, {"actor,reward": "0-3", "rollout": "4-7"}))
    with pytest.raises(PlacementError, match="overlap partly"):
        placement_mode(_cfg(8, {"actor,reward": "0-3", "rollout": "2-7"}))
    with pytest.raises(PlacementError, match="actor GPUs 0-3 and rollout GPUs 0-7"):  # two nodes: all = 0-7
        placement_mode(_cfg(4, {"actor": "0-3", "rollout,reward": "all"}, num_nodes=2))


def test_a_cpu_cluster_is_disaggregated():
    """CPU ranks are processes: the same process ranks share no GPU (the paired CPU sync route is another matter)."""
    assert placement_mode(_cfg(0, {"actor,rollout,reward": "all"})) == "disaggregated"
    assert not is_collocated(_cfg(0, {"actor,rollout,reward": "0-1"}))


def test_validate_refuses_a_partial_overlap(reference_env):
    result = check_config("qwen2.5-3b-tool-1node", ["cluster.component_placement={'actor,reward': 0-3, rollout: 2-7}"])
    issues = [i for i in result.issues if i.key == "cluster.component_placement"]
    assert len(issues) == 1 and "overlap partly" in issues[0].reason, [str(i) for i in result.issues]
    assert "equal or disjoint" in issues[0].fix
    # the offload and memory rules say nothing more about a placement that is already refused
    assert not [i for i in result.issues if i.key.startswith("actor.offload") or "memory" in i.reason.lower()]


def test_a_cpu_cluster_may_overlap_its_processes(reference_env):
    result = check_config("tiny-cpu", ["cluster.component_placement={'actor,reward': 0-1, rollout: 1-2}"])
    assert not [i for i in result.issues if "overlap" in i.reason], [str(i) for i in result.issues]


def test_the_plan_names_the_mode(reference_env):
    from rlinf_ext.config.commands import format_plan

    def plan(*overrides):
        return format_plan(check_config("qwen2.5-3b-tool-1node", list(overrides)).cfg)

    assert "actor and rollout: collocated (they take turns on the same GPUs)" in plan()
    assert "actor and rollout: disaggregated\n" in plan(
        "cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}", "data.rollout_batch_size=256"
    )
    partial = plan("cluster.component_placement={'actor,reward': 0-3, rollout: 2-7}")
    assert "overlap partly" in partial and "actor and rollout:" not in partial
    assert "memory per GPU: not estimated (fix the placement first)" in partial
