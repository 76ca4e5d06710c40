"""The runner tests' Ray instance: one private one-node Ray for every test of this directory that asks for
``cluster`` or ``joined_cluster`` (starting one, with RLinf's managers, costs ~20 CPU-s: ~25 s on a busy 2-core
box), started as the launcher starts a run's. The tests only launch worker groups on it and kill them afterwards.
It is stopped after the last test of this directory (``pytest_runtest_teardown``). Under ``-n 2`` the directory is
one unit of work (tests/conftest.py, SHARED_PROCESS_DIRS): one worker runs all of it on one instance."""

from __future__ import annotations

import contextlib
import os

import pytest

RUNNER_DIR = os.path.dirname(os.path.abspath(__file__))
RAY_ADDRESS = "RAY_ADDRESS"
TINY_CONFIG = "tiny-cpu"  # its cluster section: one node, no accelerator


class SharedRay:
    """Started on first use through the launcher's own code path (``runner/services.py:rlinf_cluster`` for the
    tiny config: ``RAY_ADDRESS=local`` while RLinf's Cluster starts it, no idle workers, the workers pinned to it,
    the placement checked), and again after a stop; stopped by leaving that context (workers killed, Ray down,
    ``RAY_ADDRESS`` as it was)."""

    def __init__(self) -> None:
        self.joined = None
        self._context: contextlib.ExitStack | None = None
        self._users_address: str | None = None

    def get(self):
        """The running instance's ``JoinedCluster``."""
        import ray

        if self.joined is None or not ray.is_initialized():
            self.stop()
            from rlinf_ext.config.loader import load_config
            from rlinf_ext.runner.services import rlinf_cluster

            # unset while it starts: the one-node default ("local", a private instance), as for a user's launch
            self._users_address = os.environ.pop(RAY_ADDRESS, None)
            context = contextlib.ExitStack()
            try:
                self.joined = context.enter_context(rlinf_cluster(load_config(TINY_CONFIG, [])))
            except BaseException:
                context.close()
                self._put_back_users_address()
                raise
            self._context = context
        return self.joined

    def stop(self) -> None:
        if self._context is None:
            return
        context, self._context, self.joined = self._context, None, None
        context.close()
        # the launcher puts the driver's environment back (its RAY_ADDRESS was unset when the instance started)
        assert os.environ.get(RAY_ADDRESS) is None, f"RAY_ADDRESS={os.environ.get(RAY_ADDRESS)} after Ray went down"
        self._put_back_users_address()

    def _put_back_users_address(self) -> None:
        if self._users_address is not None:
            os.environ[RAY_ADDRESS] = self._users_address
            self._users_address = None


SHARED_RAY = SharedRay()


@pytest.fixture
def joined_cluster():
    """The shared private Ray instance as the launcher holds it (``runner/services.py:JoinedCluster``; its
    ``RAY_ADDRESS=local`` is set while it runs)."""
    return SHARED_RAY.get()


@pytest.fixture
def cluster(joined_cluster):
    """The shared private Ray instance's RLinf ``Cluster``."""
    return joined_cluster.cluster


@pytest.fixture(scope="module")
def module_cluster():
    """``cluster`` for a module-scoped fixture (the instance stays up until the directory's last test)."""
    return SHARED_RAY.get().cluster


def pytest_runtest_teardown(item, nextitem):
    # the last test of this directory: nothing after it reuses the instance, so it goes down now
    if nextitem is None or not os.path.abspath(str(nextitem.path)).startswith(RUNNER_DIR + os.sep):
        SHARED_RAY.stop()


def pytest_sessionfinish(session, exitstatus):
    SHARED_RAY.stop()  # an interrupted run (-x, Ctrl-C) leaves no Ray behind
