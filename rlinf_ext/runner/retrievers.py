"""Retrieval servers of a run on several nodes (``retrieval.launch`` with ``retrieval.per_node``): one server on
every node, started by a Ray actor pinned to that node, bound to the node's IP (so the other nodes can fail over
to it), its address file in ``RUN_DIR/retrievers/`` (on a shared filesystem: one directory listing them all).
The launcher hands the search tool the list of addresses directly, so nodes without a shared filesystem work too;
each agent loop asks the server of its own node first (``tools/search.py``).

``advertised_address`` covers the other case, one launched server: bound to ``0.0.0.0`` it is reached through
the driver node's IP.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.retrieval.launch import RetrievalServerProcess
from rlinf_ext.runner.cluster import NodeOrder
from rlinf_ext.runner.errors import LaunchError

ADDRESS_DIR = "retrievers"  # RUN_DIR/retrievers/Host<ip>_IP<port>.txt
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class NodeRetriever:
    """Holds one retrieval server process on the node it is pinned to (a plain Ray actor)."""

    def __init__(self, kwargs: dict[str, Any]):
        self.process = RetrievalServerProcess(**kwargs)

    def start(self) -> str:
        return self.process.start()

    def stop(self) -> None:
        self.process.stop()


def server_kwargs(cfg: ExperimentConfig, host: str, address_dir: Path, log_path: Path) -> dict[str, Any]:
    """``RetrievalServerProcess`` arguments for a server on ``host`` (a free port) from ``cfg.retrieval``."""
    r = cfg.retrieval
    return dict(
        index_dir=r.index_dir,
        corpus=r.corpus_path,
        pages=r.pages_path,
        host=host,
        port=0,
        topk=r.topk,
        model=r.model_path,
        retriever=r.retriever,
        max_batch_size=r.max_batch_size,
        max_wait_ms=r.max_wait_ms,
        save_address_to=str(address_dir),
        log_path=str(log_path),
    )


@contextlib.contextmanager
def node_retrievers(cfg: ExperimentConfig, order: NodeOrder, run_dir: Path) -> Iterator[list[str]]:
    """Start one server per node of ``order`` (in parallel); yields their ``host:port`` in node order; stops
    them all on exit."""
    address_dir = run_dir / ADDRESS_DIR
    remote_cls = ray.remote(num_cpus=0)(NodeRetriever)  # no CPU held: it must not keep a worker off the node
    actors = []
    try:
        for k, node in enumerate(order.nodes):
            log_path = run_dir / "logs" / f"retrieval_server_node{k}.log"
            strategy = NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
            actors.append(
                remote_cls.options(scheduling_strategy=strategy).remote(
                    server_kwargs(cfg, node.ip, address_dir, log_path)
                )
            )
        urls = []
        for k, handle in enumerate([a.start.remote() for a in actors]):
            try:
                urls.append(ray.get(handle))
            except Exception as exc:
                raise LaunchError(
                    f"retrieval server on node {k} ({order.nodes[k].label()}) failed to start "
                    f"(log on that node: {run_dir / 'logs'}): {exc}"
                ) from exc
        for k, url in enumerate(urls):
            print(f"[launch] retrieval server of node {k}: {url}", flush=True)
        yield [u.removeprefix("http://") for u in urls]
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):  # its node may be gone already
                ray.get(actor.stop.remote(), timeout=30)
            with contextlib.suppress(Exception):
                ray.kill(actor)


def advertised_address(address: str, node_ip: str) -> str:
    """``host:port`` of a launched server as other nodes reach it: a wildcard bind goes through ``node_ip``."""
    host, _, port = address.rpartition(":")
    return f"{node_ip}:{port}" if host.strip("[]") in WILDCARD_HOSTS else address
