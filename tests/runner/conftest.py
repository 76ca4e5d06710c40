"""The runner tests' Ray instance: one private one-node Ray for every test of this directory that asks for
``cluster`` (starting one takes ~25 s on a busy 2-core box; it used to start once per module). The tests only
launch worker groups on it and kill them afterwards, as they did inside a module. It is stopped after the last
test of this directory (``pytest_runtest_teardown``), and before a test that starts a Ray instance of its own in
this process (``no_shared_ray``). Under ``-n 2`` each worker process that runs these tests has its own instance
(RAY_ADDRESS=local: a private one), so two may run at once."""

from __future__ import annotations

import os

import pytest

RUNNER_DIR = os.path.dirname(os.path.abspath(__file__))


class SharedRay:
    """Starts the instance on first use, as the launcher does (``RAY_ADDRESS=local`` while RLinf's Cluster starts
    it: its ``address="auto"`` would join any Ray running on the machine; then the workers are pinned to it,
    ``runner/cluster.py``), and again after a stop."""

    def __init__(self) -> None:
        self.cluster = None

    def get(self):
        import ray
        from rlinf.scheduler import Cluster

        from rlinf_ext.runner.cluster import PRIVATE_INSTANCE_ENV, pin_workers_to_cluster
        from rlinf_ext.runner.services import ray_settings

        if self.cluster is None or not ray.is_initialized():
            with ray_settings(PRIVATE_INSTANCE_ENV):
                self.cluster = Cluster(num_nodes=1)
            pin_workers_to_cluster(self.cluster, ray.get_runtime_context().gcs_address)
        return self.cluster

    def stop(self) -> None:
        if self.cluster is None:
            return
        from rlinf_ext.runner.services import shutdown_ray

        self.cluster = None
        shutdown_ray()  # also forgets RLinf's Cluster singleton, so a later start gets a fresh Ray instance


SHARED_RAY = SharedRay()


@pytest.fixture
def cluster(monkeypatch):
    """The shared private Ray instance's RLinf ``Cluster`` (``RAY_ADDRESS=local`` during the test, as before)."""
    monkeypatch.setenv("RAY_ADDRESS", "local")
    return SHARED_RAY.get()


@pytest.fixture
def no_shared_ray():
    """For a test that starts its own Ray instance in this process: the shared one is stopped first."""
    SHARED_RAY.stop()


def pytest_runtest_teardown(item, nextitem):
    # the last test of this directory: nothing after it reuses the instance, so it goes down now
    if nextitem is None or not os.path.abspath(str(nextitem.path)).startswith(RUNNER_DIR + os.sep):
        SHARED_RAY.stop()


def pytest_sessionfinish(session, exitstatus):
    SHARED_RAY.stop()  # an interrupted run (-x, Ctrl-C) leaves no Ray behind
