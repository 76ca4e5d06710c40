"""A multi-node Ray cluster on one machine for the multi-node tests: a head and further nodes started with the
venv's ``ray start``, each bound to its own loopback address (127.0.0.2, ...) with its own CPUs and temp dir.

Token authentication is on (Ray's default for ``ray start --head``) with a token file of the test's own, every
port is a free one (several clusters may run on the machine at once), and a node is stopped the way ``ray stop``
stops one, but only this cluster's processes: SIGTERM to every process under the node's temp dir and to their
descendants (the workers, renamed ``ray::...``), SIGKILL after a grace period (``ray stop`` itself would stop
every Ray on the machine). Not a test module itself.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

RAY_BIN = Path(sys.executable).with_name("ray")


RAY_START_TIMED_OUT = "timed out during startup"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    """``with LocalRayCluster() as c: c.start_head(2); c.add_node("127.0.0.2", 2)``; ``c.env`` is the environment
    a driver (the launcher) needs to join it."""

    def __init__(self) -> None:
        # a short root: Ray's Unix sockets live under it and their paths are limited to 107 characters
        self.root = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))
        token = self.root / "token"
        token.write_text(secrets.token_hex(32))
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0")
        self.address: str | None = None
        self.nodes: dict[str, str] = {}  # name -> node IP
        self.temp_dirs: dict[str, Path] = {}  # name -> the temp dir of its current start

    def _start(self, name: str, args: list[str], timeout_s: float = 240) -> None:
        """`ray start`, tried twice when Ray gave up on its raylet registering within its fixed 30 s
        (``ray/_private/node.py``: "timed out during startup"), which a loaded 2-core box can exceed."""
        try:
            self._start_once(name, args, timeout_s)
        except RuntimeError as exc:
            if RAY_START_TIMED_OUT not in str(exc):
                raise
            self.stop_node(name, grace_s=2.0)  # the attempt's processes (by its temp dir); then a fresh temp dir
            self._start_once(name, args, timeout_s)

    def _start_once(self, name: str, args: list[str], timeout_s: float) -> None:
        # a node started again under a name gets a fresh temp dir: the stopped node's session files stay behind
        temp_dir, n = self.root / name, 1
        while temp_dir.exists():
            temp_dir, n = self.root / f"{name}.{n}", n + 1
        self.temp_dirs[name] = temp_dir
        command = [
            str(RAY_BIN),
            "start",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            *args,
        ]
        log = self.root / f"{temp_dir.name}.log"
        with open(log, "w") as out:
            code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=self.env, timeout=timeout_s)
        if code != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed ({code}):\n{log.read_text()[-3000:]}")

    def start_head(self, num_cpus: int) -> str:
        self._start(
            "head",
            [
                "--head",
                "--port=0",
                f"--num-cpus={num_cpus}",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
            ],
        )
        self.address = (self.temp_dirs["head"] / "ray_current_cluster").read_text().strip()
        self.nodes["head"] = self.address.rpartition(":")[0]
        self.env["RAY_ADDRESS"] = self.address
        return self.address

    def add_node(self, name: str, ip: str, num_cpus: int) -> None:
        """`ray start --address` for ``name``, then wait until the GCS counts it alive: a node started again on the
        address of one just stopped has been seen to start and then not be counted (a loaded box, the stopped
        node's death still pending); it is started once more then."""
        for attempt in (1, 2):
            env_address = self.env.pop("RAY_ADDRESS")  # `ray start --address` names it; the env var would win
            try:
                self._start(name, [f"--address={self.address}", f"--node-ip-address={ip}", f"--num-cpus={num_cpus}"])
            finally:
                self.env["RAY_ADDRESS"] = env_address
            self.nodes[name] = ip
            missing = self._nodes_missing(timeout_s=60)
            if missing is None:
                return
            self.stop_node(name, grace_s=2.0)
        raylet = self.temp_dirs[name] / "session_latest" / "logs" / "raylet.out"
        tail = raylet.read_text()[-3000:] if raylet.is_file() else f"({raylet} missing)"
        raise RuntimeError(f"node {name} ({ip}) started twice but never counted alive: {missing}\n{tail}")

    def _nodes_missing(self, timeout_s: float) -> str | None:
        """None once every node of this cluster is alive in the GCS, else the launcher's own wait error."""
        probe = (
            f"from rlinf_ext.runner.cluster import wait_for_nodes\nwait_for_nodes(None, {len(self.nodes)}, {timeout_s})"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=timeout_s + 120
        )
        return None if done.returncode == 0 else done.stderr[-2000:]

    def processes(self, name: str) -> list[psutil.Process]:
        """Every process of node ``name``: those started with its temp dir, and their descendants."""
        temp_dir = str(self.temp_dirs[name])
        found: set[psutil.Process] = set()
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid == os.getpid():
                continue
            args = proc.info["cmdline"] or []
            if any(a.endswith("=" + temp_dir) or temp_dir + "/" in a for a in args):
                found.add(proc)
                try:
                    found.update(proc.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        return sorted(found, key=lambda p: p.pid)

    def stop_node(self, name: str, grace_s: float = 10.0) -> None:
        """Freeze every process of the node at once (SIGSTOP: nothing on it makes progress from this moment, so a
        test knows which step a run was in), then stop them as ``ray stop`` does: SIGTERM, SIGKILL after
        ``grace_s``."""
        procs = self.processes(name)
        for send in (psutil.Process.suspend, psutil.Process.terminate, psutil.Process.resume):
            for proc in procs:
                try:
                    send(proc)
                except psutil.NoSuchProcess:
                    pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        self.nodes.pop(name, None)

    def close(self) -> None:
        for name in sorted(self.nodes, key=lambda n: n == "head"):  # the head last
            self.stop_node(name, grace_s=2.0)  # the end of the tests: nothing on it to let finish (10 s -> ~2 s)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
