"""The launcher's Ray cluster and ``RAY_ADDRESS`` (docs/contracts.md, "Runner"): the address policy, and the
start-up hang it prevents (a second Ray instance). The one-node launcher used to leave ``RAY_ADDRESS=local`` in every worker's
environment; RLinf's non-actor ``Worker`` (built inside each SGLang scheduler process) calls
``ray.init(address="auto")``, which then started a second Ray instance and waited forever for RLinf's managers.
The regression test reproduces that pattern on CPU: inside a worker of a cluster started by the launcher's code
path, a plain subprocess builds RLinf's non-actor ``Worker`` and must join the same cluster (same GCS address)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rlinf_ext.runner.cluster import PRIVATE_INSTANCE_ENV, ray_address_for
from rlinf_ext.runner.services import ray_settings

# what rlinf/hybrid_engines/sglang/common/sgl_scheduler.py does in each scheduler process (a child of the actor)
NON_ACTOR_WORKER = """
import sys, time
t0 = time.monotonic()
import ray
from rlinf.scheduler import Worker
from rlinf.scheduler.manager import WorkerAddress
t1 = time.monotonic()
worker = Worker(parent_address=WorkerAddress.from_name(sys.argv[1]), world_size=1, rank=0)
print("GCS=" + ray.get_runtime_context().gcs_address, flush=True)
print(f"imports {t1 - t0:.1f} s, ray.init + RLinf registration {time.monotonic() - t1:.1f} s", flush=True)
"""
# joining takes seconds (plus the imports, slow on a loaded 2-core box); the D1 hang never returns: the bound only
# keeps CI from hanging
JOIN_TIMEOUT_S = 180


def test_ray_address_policy():
    # one node: a private Ray instance, never whatever Ray happens to run on the machine
    assert ray_address_for(1, {}) == "local"
    # several nodes: the user's `ray start` cluster (auto-detected by Ray)
    assert ray_address_for(2, {}) is None
    # an explicit RAY_ADDRESS wins over both, cluster.ray_address over RAY_ADDRESS
    assert ray_address_for(1, {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert ray_address_for(2, {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.9:6379") == "10.0.0.9:6379"


def make_probe_worker():
    """An RLinf Worker that starts the non-actor-Worker subprocess (defined here: cloudpickle ships it by value)."""
    from rlinf.scheduler import Worker

    class SpawningWorker(Worker):
        def environment(self) -> str | None:
            return os.environ.get("RAY_ADDRESS")

        def spawn_nested_worker(self, timeout_s: float) -> tuple[int, str, float]:
            started = time.monotonic()
            try:
                done = subprocess.run(
                    [sys.executable, "-c", NON_ACTOR_WORKER, self.worker_address.get_name()],
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                )
                out, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as exc:
                out, code = f"no answer in {timeout_s} s: {exc.stdout or ''}{exc.stderr or ''}", -1
            return code, out, time.monotonic() - started

    return SpawningWorker


def test_ray_settings_default_while_the_instance_starts_and_the_users_own_win(monkeypatch):
    name = "RAY_prestart_worker_first_driver"
    assert PRIVATE_INSTANCE_ENV == {name: "0"}  # no idle workers: RLinf's all carry a runtime_env
    monkeypatch.delenv(name, raising=False)
    with ray_settings(PRIVATE_INSTANCE_ENV):
        assert os.environ[name] == "0"
    assert name not in os.environ
    monkeypatch.setenv(name, "1")
    with ray_settings(PRIVATE_INSTANCE_ENV):
        assert os.environ[name] == "1"
    assert os.environ[name] == "1"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_process_started_by_a_worker_joins_the_launchers_cluster(joined_cluster):
    """On the runner tests' instance, started by the launcher's ``rlinf_cluster`` (tests/runner/conftest.py)."""
    from rlinf.scheduler.placement import NodePlacementStrategy
    from trainer_helpers import kill_group

    joined = joined_cluster
    group = (
        make_probe_worker()
        .create_group()
        .launch(joined.cluster, placement_strategy=NodePlacementStrategy([0]), name="d1_probe")
    )
    try:
        assert group.environment().wait() == [joined.gcs_address]  # not "local"
        code, out, seconds = group.spawn_nested_worker(JOIN_TIMEOUT_S).wait()[0]
    finally:
        kill_group(group)
    assert code == 0, out[-3000:]
    assert f"GCS={joined.gcs_address}" in out, out[-3000:]
    print(f"nested RLinf Worker joined the launcher's cluster in {seconds:.1f} s: {out.strip().splitlines()[-1]}")
