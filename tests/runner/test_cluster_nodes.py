"""The run's nodes (runner/cluster.py): stable order, what the placement needs from each node, the check before
any worker starts, lost nodes, and the CPU placement syntax across nodes (config/placement.py). Pure functions,
hand-computed cases; the real two-node cluster is tests/e2e/test_multinode.py."""

from __future__ import annotations

import pytest

from rlinf_ext.config.loader import load_config
from rlinf_ext.config.placement import ComponentPlan, PlacementError, parse_cpu_spec
from rlinf_ext.runner.cluster import (
    NodeOrder,
    NodeView,
    cpu_process_nodes,
    describe_lost,
    lost_nodes,
    nodes_from_ray,
    placement_needs,
    placement_problems,
    stable_order,
)
from rlinf_ext.runner.retrievers import advertised_address


def test_stable_order_is_by_ip_numerically_then_node_id():
    nodes = [
        NodeView("10.0.0.10", "b"),
        NodeView("10.0.0.9", "z"),
        NodeView("10.0.0.10", "a"),
        NodeView("127.0.0.2", "c"),
        NodeView("node-x", "d"),
    ]
    order = [(n.ip, n.node_id) for n in stable_order(nodes)]
    # "10.0.0.9" < "10.0.0.10" as addresses (not as strings); one IP, two raylets: by id; names last
    assert order == [("10.0.0.9", "z"), ("10.0.0.10", "a"), ("10.0.0.10", "b"), ("127.0.0.2", "c"), ("node-x", "d")]
    assert stable_order(list(reversed(nodes))) == stable_order(nodes)


def test_nodes_from_ray_keeps_alive_nodes_with_their_resources():
    listing = [
        {"NodeManagerAddress": "10.0.0.2", "NodeID": "n2", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 8.0}},
        {"NodeManagerAddress": "10.0.0.3", "NodeID": "n3", "Alive": False, "Resources": {"CPU": 4.0}},
        {"NodeManagerAddress": "10.0.0.1", "NodeID": "n1", "Alive": True, "Resources": {}},
    ]
    assert nodes_from_ray(listing) == [NodeView("10.0.0.2", "n2", 4.0, 8.0), NodeView("10.0.0.1", "n1", 0.0, 0.0)]


def test_node_order_translates_placement_nodes_to_rlinf_ranks():
    # RLinf: the driver's node first (10.0.0.5), then by IP; the run's order: by IP
    order = NodeOrder(stable_order([NodeView("10.0.0.5", "h", rlinf_rank=0), NodeView("10.0.0.1", "w", rlinf_rank=1)]))
    assert [order.rlinf_rank(k) for k in (0, 1)] == [1, 0]
    with pytest.raises(PlacementError, match="placement node 2 does not exist: the cluster has 2 node"):
        order.rlinf_rank(2)
    assert "node 0: 10.0.0.1, Ray node w, 0 CPU(s), 0 GPU(s), RLinf rank 1" in order.table()


def test_cpu_spec_spreads_processes_evenly_over_nodes():
    assert parse_cpu_spec("0-1", 1) == ([0, 1], [0, 0])  # plain ranks: processes on node 0
    assert parse_cpu_spec("1:0", 2) == ([0], [1])
    assert parse_cpu_spec("0-1:0-3", 2) == ([0, 1, 2, 3], [0, 0, 1, 1])
    for spec, words in (
        ("2:0", "node 2 but cluster.num_nodes is 2"),
        ("0-1:0-2", "do not split evenly"),
        ("0:1", "do not split evenly"),
        ("0:0:1", "more than one"),
    ):
        with pytest.raises(PlacementError, match=words):
            parse_cpu_spec(spec, 2)
    plan = ComponentPlan("actor", (0, 1, 2, 3), 0, process_nodes=(0, 0, 1, 1))
    assert plan.nodes() == {0: [0, 1], 1: [2, 3]}  # what `rlinf-ext plan` prints per node


def two_node_cfg(placement: str, **extra):
    overrides = ["cluster.num_nodes=2", f"cluster.component_placement={placement}"]
    return load_config("tiny-cpu", overrides + [f"{k}={v}" for k, v in extra.items()])


def test_cpu_process_nodes_agent_loop_follows_the_rollout():
    cfg = two_node_cfg("{actor: '0:0', rollout: '1:0-1', reward: '0:0'}")
    assert cpu_process_nodes(cfg) == {"rollout": [1, 1], "actor": [0], "reward": [0], "agent_loop": [1, 1]}
    cfg = two_node_cfg("{actor: '0:0', 'rollout,reward': '1:0', agentloop: '0:0'}")
    assert cpu_process_nodes(cfg)["agent_loop"] == [0]
    with pytest.raises(PlacementError, match="agent loop has 2 process"):
        cpu_process_nodes(two_node_cfg("{actor: 0, 'rollout,reward': 0, agentloop: '0-1:0-1'}"))


def test_placement_problems_name_the_node_and_the_missing_resource():
    cfg = two_node_cfg("{actor: '0:0', 'rollout,agentloop': '1:0', reward: '0:0'}")
    needs = placement_needs(cfg)
    assert {k: sorted(n.components) for k, n in needs.items()} == {0: ["actor", "reward"], 1: ["agent_loop", "rollout"]}
    fine = [NodeView("10.0.0.1", "a", cpus=2), NodeView("10.0.0.2", "b", cpus=2)]
    assert placement_problems(fine, needs, 2) == []
    no_cpu = [fine[0], NodeView("10.0.0.2", "b", cpus=0)]
    (problem,) = placement_problems(no_cpu, needs, 2)
    assert "node 1 (10.0.0.2, Ray node b) hosts agent_loop, rollout but Ray gives it 0 CPUs" in problem
    assert placement_problems(fine[:1], needs, 2) == ["cluster.num_nodes=2 but only 1 node(s) are in the Ray cluster"]


def test_gpu_placement_needs_the_gpus_its_ranks_name():
    cfg = load_config(
        "tiny-cpu",
        [
            "cluster.num_nodes=2",
            "cluster.num_gpus_per_node=4",
            "cluster.component_placement={actor: 0-3, 'rollout,reward': 4-7}",
        ],
    )
    needs = placement_needs(cfg)
    assert {k: n.gpus for k, n in needs.items()} == {0: 4, 1: 4}
    short = [NodeView("10.0.0.1", "a", cpus=8, gpus=4), NodeView("10.0.0.2", "b", cpus=8, gpus=2)]
    (problem,) = placement_problems(short, needs, 2)
    assert "node 1 (10.0.0.2, Ray node b) has 2 GPU(s); the placement uses 4 there" in problem


def test_lost_nodes_are_named_with_what_they_hosted():
    cfg = two_node_cfg("{actor: '0:0', 'rollout,agentloop': '1:0', reward: '0:0'}")
    order = NodeOrder([NodeView("10.0.0.1", "aaaa1111", rlinf_rank=0), NodeView("10.0.0.2", "bbbb2222", rlinf_rank=1)])
    assert lost_nodes(order, {"aaaa1111", "bbbb2222"}) == []
    lost = lost_nodes(order, {"aaaa1111"})
    assert (
        describe_lost(lost, placement_needs(cfg))
        == "node 1 (10.0.0.2, Ray node bbbb2222; it hosted agent_loop, rollout)"
    )


def test_a_wildcard_server_is_advertised_through_the_node_ip():
    assert advertised_address("0.0.0.0:8123", "10.0.0.1") == "10.0.0.1:8123"
    assert advertised_address("127.0.0.1:8123", "10.0.0.1") == "127.0.0.1:8123"
    assert advertised_address("10.0.0.7:8123", "10.0.0.1") == "10.0.0.7:8123"
