"""Two Ray nodes on one machine (tests/e2e/ray_nodes.py: a head on this machine's address, a second raylet on
127.0.0.2, each with its own CPUs): the tiny experiment with the actor and reward on one node and the rollout and
agent loop on the other, one retrieval server per node; which node each worker ran on is read from Ray's own
actor table. Then a node is stopped mid-run: the launcher stops with an error naming the node and the checkpoint,
and once the node is back a resume finishes the run.

The run is PPO with the Megatron critic (``algorithm.adv_type=gae critic.use_critic_model=true``, collocated in the
actor's processes), four steps, the first the critic's warm-up: every step logs the critic's metrics, the warm-up
step leaves the policy alone, the resume restores the critic from the checkpoint the lost node left (its exactness:
tests/runner/test_trainer_cpu.py, 3 steps == 2 steps + resume + 1, value loss included), and the final checkpoint
holds the critic beside the actor. One run for all of it: a launch costs ~45 CPU-s of start-up."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from launch_helpers import launch, metrics_rows, when_step_logged
from ray_nodes import LocalRayCluster

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.runner.cluster import NodeView, stable_order
from rlinf_ext.workers.actor import CRITIC_DIR

pytestmark = pytest.mark.slow

WORKER_IP = "127.0.0.2"
SMALL = [  # the smallest run that still searches and trains: one prompt, a group of two
    "data.rollout_batch_size=1",
    "algorithm.group_size=2",
    "algorithm.n_minibatches=1",
    "algorithm.training_batch_size_per_gpu=2",
    "algorithm.sampling_params.max_new_tokens=24",
    "agentloop.response_length_total=160",
    "runner.val_before_train=false",
    "runner.save_interval=1",
    "--no-eval",
]
STEPS = 4
PPO = [  # the critic's warm-up is step 1: no policy update then, one per step after
    "algorithm.adv_type=gae",
    "critic.use_critic_model=true",
    "critic.critic_warmup=1",
    "critic.optim.lr=1e-3",
]
# Ray's actor table from the GCS (ray.util.state needs the dashboard, which the test cluster does not run)
ACTOR_TABLE = """
import json, ray
from ray._private import state
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
print(json.dumps([{"class": a["ActorClassName"], "name": a["Name"], "ip": a["Address"]["IPAddress"]}
                  for a in state.actors().values()]))
"""


@pytest.fixture(scope="module")
def two_nodes():
    with LocalRayCluster() as cluster:
        cluster.start_head(num_cpus=2)
        cluster.add_node("w1", WORKER_IP, num_cpus=2)
        yield cluster


def node_numbers(cluster: LocalRayCluster) -> tuple[int, int]:
    """(placement node of the head, of the second node): the run's stable order is by IP."""
    order = [n.ip for n in stable_order([NodeView(cluster.nodes["head"], "h"), NodeView(WORKER_IP, "w")])]
    return order.index(cluster.nodes["head"]), order.index(WORKER_IP)


def two_node_args(cluster: LocalRayCluster, tiny_assets, out, tag: str) -> list[str]:
    head, worker = node_numbers(cluster)
    return [
        f"paths.tiny_assets={tiny_assets.root}",
        f"runner.output_dir={out}",
        f"rollout.model.model_path={tiny_assets.qwen2_tiny_sft_search}",
        *SMALL,
        "cluster.num_nodes=2",
        "retrieval.per_node=true",
        f"cluster.component_placement={{actor: '{head}:0', reward: '{head}:0', 'rollout,agentloop': '{worker}:0'}}",
        # group names of this test's own, to find its workers in Ray's actor table
        *(f"{key}.group_name={tag}{key.capitalize()}" for key in ("actor", "reward", "rollout", "agentloop")),
    ]


# One run for the three checks (a launch on two nodes costs ~80 s on 2 cores): where each worker ran, a lost node,
# PPO's critic through it.
@pytest.mark.timeout(900)
def test_ppo_on_two_nodes_places_each_worker_and_a_lost_node_stops_the_run_naming_it_and_a_resume_finishes(
    two_nodes, tiny_assets_sft, tmp_path
):
    run_dir = tmp_path / "searchr1-grpo-tiny-cpu"
    args = [*two_node_args(two_nodes, tiny_assets_sft, tmp_path, "TwoNode"), f"runner.max_steps={STEPS}", *PPO]
    watch = when_step_logged(run_dir, 1, lambda: two_nodes.stop_node("w1"))
    try:
        code, log = launch(args, env=two_nodes.env, timeout=420)
    finally:
        watch.finish()  # the launcher sees the node gone before stop_node returns
        if "w1" not in two_nodes.nodes:  # the node comes back for the resume (and the module's other tests)
            two_nodes.add_node("w1", WORKER_IP, num_cpus=2)
    assert code == 1, log[-4000:]
    head, worker = node_numbers(two_nodes)
    head_ip = two_nodes.nodes["head"]
    # one retrieval server per node, each on its node's address
    servers = dict(re.findall(r"retrieval server of node (\d): http://([\d.]+):\d+", log))
    assert servers == {str(head): head_ip, str(worker): WORKER_IP}, log[-4000:]
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.name != f"global_step_{STEPS}", "the run ended before the node stopped"
    message = log[log.index("rlinf-ext train: ") :]
    assert f"node {worker} ({WORKER_IP}, Ray node" in message and "left the Ray cluster" in message, message
    assert f"resume from {checkpoint} with runner.resume_dir=auto" in message, message

    code, log = launch([*args, "runner.resume_dir=auto"], env=two_nodes.env, timeout=420)
    assert code == 0, log[-4000:]
    assert f"resumed from {checkpoint}" in log
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert sum(r["agent/searches"] for r in rows) > 0 and all(r["agent/search_failures"] == 0 for r in rows), rows
    final = latest_complete_checkpoint(run_dir / "checkpoints")
    assert final == run_dir / "checkpoints" / f"global_step_{STEPS}"
    assert (final / "actor").is_dir() and (final / CRITIC_DIR).is_dir()
    # PPO: the critic's metrics at every step; the warm-up step (1) leaves the policy alone, each later step (the
    # resumed ones included: the warm-up is not repeated) makes one policy update
    for row in rows:
        assert set(mk.CRITIC_METRICS) <= set(row), sorted(row)
        assert math.isfinite(row[mk.CRITIC_VALUE_LOSS]) and 0.0 <= row[mk.CRITIC_VALUE_CLIP_FRAC] <= 1.0, row
    assert rows[0][mk.ACTOR_OPTIMIZER_STEPS] == 0 and mk.ACTOR_LOSS not in rows[0], rows[0]
    assert all(r[mk.ACTOR_OPTIMIZER_STEPS] == 1 and math.isfinite(r[mk.ACTOR_LOSS]) for r in rows[1:]), rows

    # both launches' workers (the first's died with their node) ran where the placement says
    table = subprocess.run(
        [sys.executable, "-c", ACTOR_TABLE], env=two_nodes.env, capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0, table.stderr[-3000:]
    where: dict[str, set[str]] = {}
    for actor in json.loads(table.stdout.strip().splitlines()[-1]):
        where.setdefault(actor["name"], set()).add(actor["ip"])
    assert where["TwoNodeActor:0"] == where["TwoNodeReward:0"] == {head_ip}, where
    assert where["TwoNodeRollout:0"] == where["TwoNodeAgentloop:0"] == {WORKER_IP}, where


@pytest.mark.timeout(300)
def test_joining_waits_for_the_nodes_and_names_those_it_saw(two_nodes):
    """cluster.num_nodes=3 on a 2-node cluster: RLinf's Cluster would wait forever; the launcher's join gives up
    after cluster.join_timeout_s with the nodes it saw."""
    probe = (
        "from rlinf_ext.runner.cluster import wait_for_nodes\n"
        "print(len(wait_for_nodes(None, 2, 60)), flush=True)\n"
        "wait_for_nodes(None, 3, 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=two_nodes.env, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0 and done.stdout.strip() == "2", done.stdout + done.stderr[-3000:]
    error = done.stderr[done.stderr.index("LaunchError") :]
    assert "cluster.num_nodes=3 but 2 node(s) joined the Ray cluster" in error, error
    assert two_nodes.nodes["head"] in error and WORKER_IP in error and "ray start --address" in error, error
