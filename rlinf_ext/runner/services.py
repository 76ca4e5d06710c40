"""The services a run starts and must stop: signal handling, the Ray cluster through RLinf's ``Cluster``, the
retrieval server, and the SGLang engine of ``rlinf-ext eval``. Each is a context manager or a check that runs
before anything starts; every one stops on success, error and Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import ray
from rlinf.scheduler import Cluster

from rlinf_ext.config import to_dictconfig
from rlinf_ext.config.memory_plan import VL_MODEL_TYPE
from rlinf_ext.config.placement import component_ranks
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.agents import agent_spec
from rlinf_ext.protocol.engines import (
    ENGINE_KEY,
    ENGINES,
    EngineUnavailable,
    engine_spec,
    make_generator,
    missing_packages,
)
from rlinf_ext.protocol.generation import Generator
from rlinf_ext.retrieval.launch import RetrievalServerError, RetrievalServerProcess
from rlinf_ext.runner.cluster import (
    JOIN_FIX,
    PRIVATE_INSTANCE,
    PRIVATE_INSTANCE_ENV,
    RAY_ADDRESS_ENV,
    NodeOrder,
    check_placement_fits,
    pin_workers_to_cluster,
    ray_address_for,
    wait_for_nodes,
)
from rlinf_ext.runner.errors import LaunchError, RunInterrupted


# ---------------------------------------------------------------- signals
@dataclass
class StopRequest:
    """A graceful stop asked for by SIGTERM (what Slurm and Kubernetes send before they kill a job).

    While ``deferring`` (the trainer's step loop), the first SIGTERM only sets ``signal_name``: the trainer
    finishes its step, writes a checkpoint and returns, and the launcher exits with ``EXIT_PREEMPTED``. Outside
    the loop, a second SIGTERM, or SIGINT (Ctrl-C): ``RunInterrupted`` at once, every clean-up still runs.
    """

    signal_name: str | None = None
    deferring: bool = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @contextlib.contextmanager
    def defer(self) -> Iterator[None]:
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False


_installed: dict[int, object] = {}  # this run's handlers, put back after ray.init replaced them
_interrupts: list[str] = []  # signals that interrupted this run (an error raised while stopping must not hide them)


def interrupt_received() -> str | None:
    """The signal that interrupted the current (or last) run, if one did."""
    return _interrupts[0] if _interrupts else None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT -> RunInterrupted; SIGTERM -> a StopRequest while deferring, else RunInterrupted. Handlers are
    restored on exit."""
    stop = StopRequest()

    def interrupt(signum, _frame):
        name = signal.Signals(signum).name
        _interrupts.append(name)
        print(
            f"\n[launch] {name} received: stopping workers, retrieval server and Ray ...", file=sys.stderr, flush=True
        )
        raise RunInterrupted(name)

    def terminate(signum, frame):
        if stop.deferring and not stop.requested:
            stop.signal_name = signal.Signals(signum).name
            print(
                f"\n[launch] {stop.signal_name} received: finishing the current step, writing a checkpoint, aborting "
                "the batches rolled out ahead (runner.max_staleness), then exiting (send it again to stop at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        interrupt(signum, frame)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _interrupts.clear()
    _installed.update({signal.SIGINT: interrupt, signal.SIGTERM: terminate})
    for s, handler in _installed.items():
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        _installed.clear()
        for s, h in previous.items():
            signal.signal(s, h)


def reinstall_signal_handlers() -> None:
    """ray.init replaces SIGTERM with sys.exit; put this run's handlers back so the exit path stays ours."""
    for s, handler in _installed.items():
        signal.signal(s, handler)


# ---------------------------------------------------------------- Ray / RLinf cluster
@dataclass
class JoinedCluster:
    """RLinf's ``Cluster`` of the run, its nodes in stable order, the GCS address every worker joins and the IP
    of the launcher's node."""

    cluster: Cluster
    order: NodeOrder
    gcs_address: str
    driver_ip: str


def start_rlinf_cluster(cfg: ExperimentConfig, address: str | None) -> Cluster:
    """RLinf's ``Cluster`` on ``address`` (already in ``RAY_ADDRESS`` when set); failures as LaunchError."""
    try:
        return Cluster(cluster_cfg=to_dictconfig(cfg).cluster)
    except Exception as exc:
        if address == PRIVATE_INSTANCE:
            raise LaunchError(
                f"cluster: could not start this run's private Ray instance: {exc}. Fix: check "
                "/tmp/ray/session_latest/logs (raylet.err, gcs_server.err); on a busy machine, "
                "retry."
            ) from exc
        raise LaunchError(
            f"cluster: could not join Ray for {cfg.cluster.num_nodes} node(s) at "
            f"{address or 'auto'}: {exc}. Fix: {JOIN_FIX}."
        ) from exc


@contextlib.contextmanager
def ray_settings(defaults: dict[str, str]) -> Iterator[None]:
    """Ray settings (``RAY_<name>`` environment variables, read by the processes a starting instance spawns) set
    while the block runs, each unless the user set it; the environment is as it was afterwards."""
    added = [name for name in defaults if name not in os.environ]
    os.environ.update({name: defaults[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def rlinf_cluster(cfg: ExperimentConfig) -> Iterator[JoinedCluster]:
    """Join (several nodes: after they are all there) or start (one node) the run's Ray cluster through RLinf's
    ``Cluster``, pin its workers to it, check that the placement fits; on exit the workers are killed and Ray is
    shut down (a private instance goes down with it)."""
    num_nodes = cfg.cluster.num_nodes
    address = ray_address_for(num_nodes, dict(os.environ), cfg.cluster.ray_address)
    saved_address = os.environ.get(RAY_ADDRESS_ENV)
    started = time.monotonic()
    try:
        if num_nodes > 1:
            wait_for_nodes(address, num_nodes, cfg.cluster.join_timeout_s)
        if address is not None:
            os.environ[RAY_ADDRESS_ENV] = address
        with ray_settings(PRIVATE_INSTANCE_ENV if address == PRIVATE_INSTANCE else {}):
            cluster = start_rlinf_cluster(cfg, address)
        reinstall_signal_handlers()
        gcs_address = ray.get_runtime_context().gcs_address
        pin_workers_to_cluster(cluster, gcs_address)
        order = NodeOrder.of_cluster(cluster)
        kind = "private local instance" if address == PRIVATE_INSTANCE else f"{num_nodes}-node cluster"
        print(f"[launch] Ray up in {time.monotonic() - started:.1f} s ({kind}, GCS {gcs_address})", flush=True)
        if num_nodes > 1:
            print(f"[launch] nodes (placement node k = k-th in this order):\n{order.table()}", flush=True)
        check_placement_fits(order, cfg)
        yield JoinedCluster(cluster, order, gcs_address, ray.util.get_node_ip_address())
    finally:
        shutdown_ray()
        if saved_address is None:
            os.environ.pop(RAY_ADDRESS_ENV, None)
        else:
            os.environ[RAY_ADDRESS_ENV] = saved_address


def join_rlinf_wait_threads(timeout_s: float) -> None:
    """Let RLinf's result-wait threads finish before Ray goes down.

    Every RLinf ``WorkerGroupFuncResult`` parks a daemon thread in ``ray.get``; Ray shut down under one ends the
    process with exit code 1 ("The core worker has already been shutdown"), a clean Ctrl-C turned crash. With the
    workers killed those calls fail fast, so a bounded join is enough.
    """
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        if thread is threading.current_thread() or getattr(target, "__name__", "") != "_wait_for_results":
            continue
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def shutdown_ray() -> None:
    """Kill this run's actors and disconnect; a Ray instance this driver started goes down with it."""
    if ray.is_initialized():
        join_rlinf_wait_threads(timeout_s=60.0)  # quick once the workers are gone; 10 s was short on 2 busy cores
        ray.shutdown()
    # RLinf's Cluster is a process-wide singleton; forget it so that a later run in this process
    # (tests, notebooks) builds a fresh one on the fresh Ray instance.
    if getattr(Cluster, "_instance", None) is not None:
        Cluster._instance = None
        del Cluster._instance


# ---------------------------------------------------------------- retrieval server
@dataclass
class LaunchedServer:
    """The retrieval server this run started: where it listens and how to find its process."""

    address: str  # host:port
    pid: int
    log_path: Path


def retrieval_server_device(cfg: ExperimentConfig) -> tuple[list[str], dict[str, str]]:
    """Server flags and environment that keep a launched retrieval server off the run's GPUs (pure): on a GPU
    cluster its encoder takes a GPU of this node that no component is placed on, else the CPU. Left to itself
    it would pick cuda:0, the GPU of actor rank 0 and SGLang engine 0."""
    gpn = cfg.cluster.num_gpus_per_node
    if gpn < 1:
        return [], {}
    used = {
        g
        for ranks in component_ranks(cfg.cluster.component_placement, cfg.cluster.num_nodes * gpn).values()
        for g in ranks
    }
    free = [g for g in range(gpn) if g not in used]
    if free:
        return ["--device", "cuda"], {"CUDA_VISIBLE_DEVICES": str(free[0])}
    return ["--device", "cpu"], {"CUDA_VISIBLE_DEVICES": ""}


@contextlib.contextmanager
def retrieval_server(cfg: ExperimentConfig, log_path: Path, startup_timeout: float = 300.0) -> Iterator[LaunchedServer]:
    """Serve ``retrieval.index_dir`` on ``retrieval.host`` (a free port when ``retrieval.port`` is 0) for the run,
    logging to ``log_path``, off the run's GPUs (``retrieval_server_device``); stopped on exit whatever happens."""
    r = cfg.retrieval
    device_args, device_env = retrieval_server_device(cfg)
    process = RetrievalServerProcess(
        r.index_dir,
        r.corpus_path,
        pages=r.pages_path,
        host=r.host,
        port=r.port,
        topk=r.topk,
        model=r.model_path,
        retriever=r.retriever,
        max_batch_size=r.max_batch_size,
        max_wait_ms=r.max_wait_ms,
        startup_timeout_s=startup_timeout,
        log_path=log_path,
        extra_args=device_args,
        env=device_env,
    )
    started = time.monotonic()
    try:
        try:
            url = process.start()
        except RetrievalServerError as exc:
            raise LaunchError(f"retrieval server failed to start (log: {log_path}): {exc}") from exc
        server = LaunchedServer(url.removeprefix("http://"), process.pid, log_path)
        print(
            f"[launch] retrieval server on {url} (pid {server.pid}, up in {time.monotonic() - started:.1f} s, "
            f"log: {log_path})",
            flush=True,
        )
        yield server
    finally:
        process.stop()


# ---------------------------------------------------------------- the engine's GPU profile
def missing_gpu_packages(cfg: ExperimentConfig) -> list[str]:
    """The packages a training run on this config needs from its engine's GPU profile and cannot find (none on a
    CPU cluster). Found without importing them (importing sglang initialises CUDA)."""
    if cfg.cluster.num_gpus_per_node < 1:
        return []
    return missing_packages(engine_spec(cfg), saver=not cfg.rollout.enforce_eager)


def check_training_backend(cfg: ExperimentConfig) -> None:
    """Refuse, before anything starts, a GPU run whose engine profile is not installed on this node (and say that
    MMSearch-R1's GPU path is not GPU-verified)."""
    spec = engine_spec(cfg)
    if cfg.rollout.model.model_type == VL_MODEL_TYPE and spec.runs_on(gpu=True):
        print(
            f"[launch] WARNING: a vision-language model on {spec.title} (images in every request, banned-id logit "
            "processor, multimodal sync probe) and the FSDP2 actor on CUDA are written but NOT GPU-verified.",
            flush=True,
        )
    missing = missing_gpu_packages(cfg)
    if missing:
        raise LaunchError(
            f"cluster.num_gpus_per_node={cfg.cluster.num_gpus_per_node} with {ENGINE_KEY}={spec.name} needs its GPU "
            f"profile, but {', '.join(missing)} cannot be imported here. Fix: {spec.install_fix} on every node; or "
            f"use the CPU profile (cluster.num_gpus_per_node=0, {ENGINE_KEY}=hf)."
        )


# ---------------------------------------------------------------- the evaluation engine (rlinf-ext eval)
def check_evaluation_backend(cfg: ExperimentConfig) -> None:
    """Refuse, before anything starts, an engine that ``rlinf-ext eval`` cannot run here: one whose entry builds no
    evaluation for the agent's modality, or whose own check (``EngineSpec.eval_preflight``) fails."""
    spec, agent = engine_spec(cfg), agent_spec(cfg)
    if not spec.evaluates(agent.vision):
        able = [name for name, s in ENGINES.items() if s.evaluates(agent.vision)]
        raise LaunchError(
            f"{ENGINE_KEY}={spec.name!r} with agentloop.agent={agent.name}: `rlinf-ext eval` runs {agent.title} on "
            f"{', '.join(able)} only. Fix: set {ENGINE_KEY}={able[0]}."
        )
    if spec.eval_preflight:
        try:
            spec.load("eval_preflight")(cfg)
        except EngineUnavailable as exc:
            raise LaunchError(f"rollout: {exc}") from exc


def start_evaluation_generator(cfg: ExperimentConfig) -> Generator | None:
    """The ``Generator`` ``rlinf-ext eval`` passes to ``run_evaluation``: a started one (the caller closes it) for an
    engine the launcher owns (``EngineSpec.started_by_launcher``: SGLang), else None (the agent's runner builds it)."""
    spec = engine_spec(cfg)
    if not spec.started_by_launcher:
        return None
    try:
        return make_generator(cfg, agent_spec(cfg).vision)
    except EngineUnavailable as exc:
        raise LaunchError(f"rollout: {exc}") from exc
    except Exception as exc:  # the engine's own start-up failures (CUDA OOM, bad model dir, ...)
        raise LaunchError(f"rollout: the {spec.title} engine failed to start: {type(exc).__name__}: {exc}") from exc
