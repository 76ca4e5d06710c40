"""The test cluster's `ray start`: tried again once when Ray gave up waiting for its raylet (a loaded box), never
for another failure."""

from __future__ import annotations

import pytest
from ray_nodes import RAY_START_TIMED_OUT, LocalRayCluster


@pytest.mark.parametrize(
    "first_error,attempts",
    [(f"Exception: The current node {RAY_START_TIMED_OUT}.", 2), ("address already in use", 1)],
)
def test_a_raylet_timeout_is_tried_again_once_and_nothing_else_is(monkeypatch, first_error, attempts):
    cluster = LocalRayCluster()
    calls, stopped = [], []

    def start_once(name, args, timeout_s):
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError(f"`ray start` failed (1):\n{first_error}")

    monkeypatch.setattr(cluster, "_start_once", start_once)
    monkeypatch.setattr(cluster, "stop_node", lambda name, grace_s: stopped.append(name))
    try:
        if attempts == 2:
            cluster._start("head", [])
        else:
            with pytest.raises(RuntimeError, match="address already in use"):
                cluster._start("head", [])
    finally:
        cluster.close()
    assert calls == ["head"] * attempts and stopped == ["head"] * (attempts - 1)
