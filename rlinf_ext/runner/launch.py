"""One run from one YAML, as a recipe: ``run_training`` (``rlinf-ext train``) and ``run_evaluation_only`` (``eval``).

``run_training``: validate the config (every error at once, the GPU extra on a GPU cluster) and print the plan; tiny
experiment: make missing assets and BM25 index; re-validate with path checks; start the retrieval server
(``retrieval.launch``; per node with ``retrieval.per_node``); join or start Ray through RLinf's ``Cluster``, launch
the groups and run the trainer (the actor reads the HF checkpoint itself); mg2hf of the last checkpoint and its eval
into ``RUN_DIR/eval/global_step_N/``; print the summary. The steps live in ``prepare.py``, ``services.py``,
``cluster.py``, ``retrievers.py`` and ``summary.py``. Every resource started here is stopped on success, error,
Ctrl-C and SIGTERM; SIGTERM while training checkpoints after the step, discards the batches in flight and raises
``RunPreempted`` (exit 75); a lost node ends the run naming it and the checkpoint to resume from."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Sequence

from rlinf_ext.config.compose import find_experiment
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.eval.core.results import RESULTS_MD
from rlinf_ext.eval.entry import evaluate_agent
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.runner.cluster import alive_node_ids, describe_lost, lost_nodes, placement_needs
from rlinf_ext.runner.compose import launch_worker_groups
from rlinf_ext.runner.errors import LaunchError, RunPreempted
from rlinf_ext.runner.groups import WorkerCallError, WorkerGroups, WorkerStartupError, stop_worker_groups
from rlinf_ext.runner.metrics import sink_from_config
from rlinf_ext.runner.prepare import (
    build_datasets,
    checkpoints_root,
    convert_last_checkpoint_to_hf,
    ensure_index,
    load_checked_config,
    prepare_tiny_assets,
    print_plan,
    run_dir,
    use_launched_server,
)
from rlinf_ext.runner.retrievers import advertised_address, node_retrievers
from rlinf_ext.runner.services import (
    JoinedCluster,
    LaunchedServer,
    StopRequest,
    check_evaluation_backend,
    check_training_backend,
    retrieval_server,
    rlinf_cluster,
    start_evaluation_generator,
    stop_on_signals,
)
from rlinf_ext.runner.summary import RunSummary, fill_from_logs
from rlinf_ext.runner.trainer import GRPOTrainer


def server_log(cfg: ExperimentConfig) -> Path:
    return run_dir(cfg) / "logs" / "retrieval_server.log"


# ---------------------------------------------------------------- training
def launch_groups(cfg: ExperimentConfig, joined: JoinedCluster, total_train_steps: int) -> WorkerGroups:
    """``compose.launch_worker_groups`` with start-up failures turned into one LaunchError."""
    started = time.monotonic()
    try:
        worker_groups = launch_worker_groups(
            cfg,
            joined.cluster,
            total_train_steps=total_train_steps,
            search_server_addr=cfg.tools.search.server_addr,
            node_order=joined.order,
            launcher_ip=joined.driver_ip,
        )
    except WorkerStartupError as exc:
        raise LaunchError(f"{exc.component} workers failed to start: {exc.cause}") from exc
    except Exception as exc:
        raise LaunchError(f"worker groups failed to start: {type(exc).__name__}: {exc}") from exc
    print(f"[launch] worker groups up in {time.monotonic() - started:.1f} s", flush=True)
    return worker_groups


def worker_failure(cfg: ExperimentConfig, joined: JoinedCluster, what: str, exc: Exception) -> LaunchError:
    """The LaunchError for a failed worker call; when nodes of the run left the Ray cluster, it names them and
    the checkpoint to resume from."""
    lost = []
    for _ in range(10 if len(joined.order.nodes) > 1 else 0):  # a node's death may reach the GCS after its
        lost = lost_nodes(joined.order, alive_node_ids())  # workers' errors
        if lost:
            break
        time.sleep(1.0)
    if not lost:
        return LaunchError(f"{what}: {exc}")
    ckpt = latest_complete_checkpoint(checkpoints_root(cfg))
    resume = (
        f"resume from {ckpt} with runner.resume_dir=auto"
        if ckpt is not None
        else "no checkpoint was written yet; rerun from the start"
    )
    return LaunchError(
        f"{what}: {describe_lost(lost, placement_needs(cfg))} left the Ray cluster. Bring the "
        f"node back (`ray start --address={joined.gcs_address}`) or lower cluster.num_nodes, then "
        f"{resume}.\n(cause: {exc})"
    )


def train(cfg: ExperimentConfig, joined: JoinedCluster, stop: StopRequest) -> dict:
    """Launch the groups, run the trainer with the metrics sink, return the trainer's summary. SIGTERM while
    training (``stop``) ends the run after the current step and a checkpoint."""
    train_ds, val_ds = build_datasets(cfg)
    total_steps = GRPOTrainer.total_steps(cfg, len(train_ds))
    worker_groups = launch_groups(cfg, joined, total_steps)
    # the trainer draws its own step progress bar; the sink's bar would be a second one
    sink = sink_from_config(cfg, total_steps=total_steps, show_progress=False)
    trainer = None
    try:
        trainer = GRPOTrainer(cfg, worker_groups, train_ds, val_ds, on_step=sink, should_stop=lambda: stop.requested)
        try:
            trainer.init_workers()
        except WorkerCallError as exc:
            raise worker_failure(cfg, joined, f"{exc.component} workers failed to initialise", exc.cause) from exc
        try:
            with stop.defer():
                return trainer.run() or {}
        except WorkerCallError as exc:
            raise worker_failure(cfg, joined, "training stopped", exc) from exc
    finally:
        if trainer is not None:
            with contextlib.suppress(Exception):  # workers may already be dead; Ray shutdown follows anyway
                trainer.shutdown()
        # kill the workers now so that RLinf's threads still waiting on their calls fail fast before Ray stops
        stop_worker_groups(worker_groups)
        sink.close()


def serve_retrieval(
    cfg: ExperimentConfig, joined: JoinedCluster, stack: contextlib.ExitStack, server: LaunchedServer | None
) -> None:
    """Point the search tool at this run's servers: one per node (``retrieval.per_node``), or the one launched
    before Ray, reached through the head's IP when it listens on every interface."""
    if cfg.retrieval.launch and cfg.retrieval.per_node:
        use_launched_server(cfg, stack.enter_context(node_retrievers(cfg, joined.order, run_dir(cfg))))
    elif server is not None:
        cfg.tools.search.server_addr = advertised_address(server.address, joined.driver_ip)


def train_on_cluster(cfg: ExperimentConfig, server: LaunchedServer | None, stop: StopRequest) -> dict:
    """The Ray part of a run: cluster, retrieval servers per node, groups and trainer; all stopped on exit."""
    with rlinf_cluster(cfg) as joined, contextlib.ExitStack() as stack:
        serve_retrieval(cfg, joined, stack, server)
        result = train(cfg, joined, stop)
    if result.get("stopped_early"):  # the checkpoint this launch wrote at the stop, else an earlier one
        ckpt = result.get("checkpoint_dir") or latest_complete_checkpoint(checkpoints_root(cfg))
        raise RunPreempted(stop.signal_name or "a stop request", int(result["steps"]), str(ckpt) if ckpt else None)
    return result


# ---------------------------------------------------------------- evaluation after training
def eval_config_for(config: str | os.PathLike) -> Path | None:
    """The sibling ``<name>-eval.yaml`` of a training YAML, if there is one."""
    train_yaml = find_experiment(str(config))
    candidate = train_yaml.with_name(f"{train_yaml.stem}-eval.yaml")
    return candidate if candidate.is_file() else None


def evaluate_after_training(
    eval_yaml: Path,
    hf_dir: Path,
    server_address: str | None,
    out_dir: Path,
    extra_overrides: Sequence[str] = (),
    show_progress: bool = True,
) -> Path | None:
    """Run the evaluation YAML on the converted model; returns the results table (``results.md``)."""
    overrides = [
        f"rollout.model.model_path={hf_dir}",
        f"runner.output_dir={out_dir.parent}",
        f"runner.experiment_name={out_dir.name}",
        *extra_overrides,
    ]
    if server_address:
        overrides += [f"tools.search.server_addr={server_address}", "retrieval.launch=false"]
    cfg = load_checked_config(eval_yaml, overrides, check_paths=True)
    print(f"[launch] evaluating {hf_dir} with {eval_yaml.name}", flush=True)
    try:
        # print_table=False: run_training prints this table itself at the very end (once)
        result = evaluate_agent(cfg, show_progress=show_progress, print_table=False)
    except Exception as exc:
        raise LaunchError(f"evaluation of {hf_dir} failed: {type(exc).__name__}: {exc}") from exc
    table = Path(result.run_dir) / RESULTS_MD
    return table if table.exists() else None


# ---------------------------------------------------------------- the recipes
def run_training(
    config: str | os.PathLike,
    overrides: Sequence[str] = (),
    *,
    show_progress: bool = True,
    evaluate: bool | None = None,
    eval_overrides: Sequence[str] = (),
) -> RunSummary:
    """Train as the YAML says (see the module docstring for the order).

    evaluate: None = evaluate the converted model when the YAML has a sibling ``-eval`` YAML and uses the tiny
    assets (the reference evaluation takes hours: run it with ``rlinf-ext eval``); True/False force it.
    eval_overrides: extra ``key=value`` for the evaluation YAML (e.g. ``data.data_size=4``).
    """
    started = time.monotonic()
    overrides = list(overrides)
    # every static problem at once, before anything is generated or started
    cfg = load_checked_config(config, overrides, check_paths=False)
    check_training_backend(cfg)  # the GPU extra on a GPU cluster, before anything starts
    if not show_progress:
        os.environ["TQDM_DISABLE"] = "1"  # every tqdm bar of this process (trainer, evaluation, conversion)
    print_plan(cfg)
    summary = RunSummary(experiment=cfg.runner.experiment_name)
    with stop_on_signals() as stop, contextlib.ExitStack() as stack:
        tiny_root = prepare_tiny_assets(cfg)
        ensure_index(cfg)
        cfg = load_checked_config(config, overrides, check_paths=True)  # paths now exist or are real errors
        server = None
        if cfg.retrieval.launch and not cfg.retrieval.per_node:
            server = stack.enter_context(retrieval_server(cfg, server_log(cfg)))
            use_launched_server(cfg, server.address)
        trainer_summary = train_on_cluster(cfg, server, stop)
        summary.extra.update(trainer_summary)
        summary.resumed_from = Path(trainer_summary["resumed_from"]) if trainer_summary.get("resumed_from") else None
        summary.checkpoint_dir, summary.hf_model_dir = convert_last_checkpoint_to_hf(cfg)
        fill_from_logs(summary, cfg, last_step=trainer_summary.get("steps"))
        eval_yaml = eval_config_for(config)
        if evaluate is None:
            evaluate = eval_yaml is not None and tiny_root is not None
        eval_error: LaunchError | None = None
        if evaluate and summary.hf_model_dir is not None:
            try:
                if eval_yaml is None:
                    raise LaunchError(f"evaluation asked for, but there is no {Path(str(config)).stem}-eval.yaml")
                # one directory per checkpoint: extending a finished run evaluates its new model beside the old
                summary.eval_table = evaluate_after_training(
                    eval_yaml,
                    summary.hf_model_dir,
                    server.address if server else None,
                    run_dir(cfg) / "eval" / summary.checkpoint_dir.name,
                    ([f"paths.tiny_assets={tiny_root}"] if tiny_root else []) + list(eval_overrides),
                    show_progress,
                )
            except LaunchError as exc:  # training results stand; report them, then the evaluation failure
                eval_error = exc
    summary.wall_time_s = time.monotonic() - started
    if summary.eval_table is not None:
        print(summary.eval_table.read_text(), flush=True)
    print(summary.format(), flush=True)
    if eval_error is not None:
        raise eval_error
    return summary


def run_evaluation_only(config: str | os.PathLike, overrides: Sequence[str] = (), show_progress: bool = True):
    """``rlinf-ext eval``: validate, start a retrieval server when the YAML asks, start the generation engine
    (sglang: in-process on this node's GPUs; hf: built by the agent's runner), evaluate, stop everything."""
    overrides = list(overrides)
    cfg = load_checked_config(config, overrides, check_paths=False)
    check_evaluation_backend(cfg)  # before anything is generated or started
    if not show_progress:
        os.environ["TQDM_DISABLE"] = "1"
    print_plan(cfg)
    with stop_on_signals(), contextlib.ExitStack() as stack:
        prepare_tiny_assets(cfg)
        ensure_index(cfg)
        cfg = load_checked_config(config, overrides, check_paths=True)
        if cfg.retrieval.launch:
            server = stack.enter_context(retrieval_server(cfg, server_log(cfg)))
            use_launched_server(cfg, server.address)
        generator = start_evaluation_generator(cfg)
        if generator is not None:
            stack.enter_context(generator)  # engine.shutdown() on the way out: success, error or Ctrl-C
        result = evaluate_agent(cfg, generator=generator, show_progress=show_progress)
    print(f"[launch] evaluation results: {result.run_dir}", flush=True)
    return result
