"""One training run from one YAML: validate, prepare, start, train, convert, evaluate, clean up.

``run_training(config, overrides)`` is what ``rlinf-ext train``, ``launchers/train.py`` and
``examples/searchr1/run_main_searchr1_single.sh`` call. The order matters:

1. load + validate the config (every error at once) before anything starts;
2. print the plan;
3. tiny experiment only: generate the offline assets if missing; build the BM25 index if missing;
4. re-validate with path checks (paths now exist or are a real error);
5. start the retrieval server on a free loopback port when ``retrieval.launch`` (its address goes into
   ``tools.search.server_addr``);
6. convert HF → Megatron when ``actor.megatron.use_hf_ckpt`` and no converted checkpoint exists yet;
7. create RLinf's ``Cluster``, launch the worker groups, run the trainer with the metrics sink;
8. convert the last checkpoint to HF (mg2hf) and run the evaluation when an eval config is given;
9. print where everything is and the first-vs-last mean reward.

Every resource started here (server, Ray cluster, worker groups) is stopped on the way out, on success,
on error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from rlinf_ext.runner.metrics import METRICS_FILE, REWARD_KEY, first_last_means, read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
# how many steps at each end of the run the "first vs last mean reward" averages over (at most; a third of
# the run when shorter): one step's mean over 32 trajectories swings by +-0.1 with the prompts it drew
REWARD_SUMMARY_WINDOW = 10
SEARCHES_KEY = "agent/searches"


class LaunchError(RuntimeError):
    """A run could not start or finish; the message names the component, the cause and the fix."""


# ---------------------------------------------------------------- config


def load_checked_config(config: str | os.PathLike, overrides: Sequence[str] = (), check_paths: bool = False):
    """Compose and validate a config (a name or a path, ``key=value`` overrides): every problem in one LaunchError."""
    from rlinf_ext.config import check_config

    checked = check_config(str(config), list(overrides), check_paths=check_paths)
    if checked.issues or checked.cfg is None:
        lines = "\n".join(f"  - {issue}" for issue in checked.issues)
        raise LaunchError(
            f"config {config}: {len(checked.issues)} problem(s); nothing was started:\n{lines}"
        )
    return checked.cfg


def print_plan(cfg) -> None:
    """The placement and batch arithmetic, as ``rlinf-ext plan`` prints it."""
    from rlinf_ext.config.commands import format_plan

    print("=" * 78)
    print(f"[launch] experiment {cfg.runner.experiment_name} -> {run_dir(cfg)}")
    print(format_plan(cfg))
    print("=" * 78, flush=True)


def run_dir(cfg) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name


# ---------------------------------------------------------------- signals


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread on SIGINT/SIGTERM so that every ``finally`` and context exit runs."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into RunInterrupted for the duration of the run; restore handlers after."""

    def handler(signum, _frame):
        name = signal.Signals(signum).name
        print(f"\n[launch] {name} received: stopping workers, retrieval server and Ray ...", file=sys.stderr,
              flush=True)
        raise RunInterrupted(name)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def reinstall_signal_handlers() -> None:
    """ray.init replaces SIGTERM with sys.exit; put our handler back so the message and exit path stay ours."""
    current = signal.getsignal(signal.SIGINT)
    if callable(current):
        signal.signal(signal.SIGTERM, current)


# ---------------------------------------------------------------- Ray / RLinf cluster


def ray_address_for(num_nodes: int, environ: dict[str, str]) -> str | None:
    """The RAY_ADDRESS the run uses.

    One node and no RAY_ADDRESS set: ``"local"``, a private Ray instance started (and stopped) by this run.
    RLinf's Cluster otherwise calls ``ray.init(address="auto")``, which joins *any* Ray found on the machine,
    e.g. another user's. Several nodes: the user's ``ray start`` cluster (RAY_ADDRESS or auto-detection).
    """
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"]
    return "local" if num_nodes <= 1 else None


@contextlib.contextmanager
def rlinf_cluster(cfg) -> Iterator[Any]:
    """RLinf's ``Cluster`` for ``cfg.cluster``; on exit the workers are killed and Ray is shut down."""
    from omegaconf import OmegaConf
    from rlinf.scheduler import Cluster

    num_nodes = int(cfg.cluster.num_nodes)
    address = ray_address_for(num_nodes, dict(os.environ))
    saved_address = os.environ.get("RAY_ADDRESS")
    if address is not None:
        os.environ["RAY_ADDRESS"] = address
    cluster_cfg = OmegaConf.create(dataclasses.asdict(cfg.cluster)) if dataclasses.is_dataclass(cfg.cluster) \
        else cfg.cluster
    started = time.monotonic()
    try:
        try:
            cluster = Cluster(cluster_cfg=cluster_cfg)
        except Exception as exc:
            raise LaunchError(
                f"cluster: could not start Ray for {num_nodes} node(s): {exc}. For several nodes run "
                f"`ray start --head` on the first node and `ray start --address=HEAD:6379` on the others, "
                f"then launch from the head node."
            ) from exc
        reinstall_signal_handlers()
        print(f"[launch] Ray cluster up in {time.monotonic() - started:.1f} s "
              f"({'private local instance' if address == 'local' else 'existing cluster'})", flush=True)
        yield cluster
    finally:
        shutdown_ray()
        if saved_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved_address


def join_rlinf_wait_threads(timeout_s: float) -> None:
    """Let RLinf's result-wait threads finish before Ray goes down.

    Every RLinf ``WorkerGroupFuncResult`` parks a daemon thread in ``ray.get``. Shutting Ray down while one is
    still inside ``ray.get`` makes Ray's core worker end the whole process with exit code 1 ("The core worker
    has already been shutdown"), which turns a clean Ctrl-C into a crash. Once the workers are killed those
    ``ray.get`` calls fail quickly, so a bounded join is enough.
    """
    import threading

    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        if thread is threading.current_thread() or getattr(target, "__name__", "") != "_wait_for_results":
            continue
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def shutdown_ray() -> None:
    """Kill this run's actors and disconnect; a Ray instance this driver started goes down with it."""
    import ray
    from rlinf.scheduler import Cluster

    if ray.is_initialized():
        join_rlinf_wait_threads(timeout_s=10.0)
        ray.shutdown()
    # RLinf's Cluster is a process-wide singleton; forget it so that a later run in this process
    # (tests, notebooks) builds a fresh one on the fresh Ray instance.
    if getattr(Cluster, "_instance", None) is not None:
        Cluster._instance = None
        del Cluster._instance


# ---------------------------------------------------------------- summary


@dataclass
class RunSummary:
    """What a finished run produced; printed at the end and returned to callers (tests, benchmark)."""

    experiment: str
    steps: int = 0
    first_reward: float | None = None
    last_reward: float | None = None
    checkpoint_dir: Path | None = None
    hf_model_dir: Path | None = None
    log_dir: Path | None = None
    plot_path: Path | None = None
    rollout_data_dir: Path | None = None
    eval_table: Path | None = None
    wall_time_s: float = 0.0
    reward_window: int = REWARD_SUMMARY_WINDOW  # steps averaged at each end for first/last reward
    validations: list[tuple[int, float, int]] = field(default_factory=list)  # (step, val/all/em, val/n)
    searches: tuple[float, float] | None = None  # mean searches per trajectory, first vs last window
    extra: dict[str, Any] = field(default_factory=dict)

    def format(self) -> str:
        def show(p):
            return str(p) if p else "(none)"

        lines = [
            "=" * 78,
            f"[launch] run '{self.experiment}' finished: {self.steps} step(s) in {self.wall_time_s:.0f} s",
        ]
        if self.first_reward is not None:
            delta = self.last_reward - self.first_reward
            k = self.reward_window
            lines.append(
                f"  mean reward, first {k} vs last {k} step(s): "
                f"{self.first_reward:.3f} -> {self.last_reward:.3f} ({delta:+.3f})"
            )
        if self.searches is not None:
            lines.append(f"  searches per trajectory, same steps: {self.searches[0]:.2f} -> {self.searches[1]:.2f}")
        if self.validations:
            points = ", ".join(f"step {step}: {em:.3f}" for step, em, _ in self.validations)
            lines.append(f"  validation EM (greedy, {self.validations[-1][2]} test questions): {points}")
        lines += [
            f"  checkpoint       : {show(self.checkpoint_dir)}",
            f"  converted HF     : {show(self.hf_model_dir)}",
            f"  logs (TB, jsonl) : {show(self.log_dir)}",
            f"  reward plot      : {show(self.plot_path)}",
            f"  trajectories     : {show(self.rollout_data_dir)}",
            f"  eval table       : {show(self.eval_table)}",
            "=" * 78,
        ]
        return "\n".join(lines)


def reward_window(n_steps: int, window: int = REWARD_SUMMARY_WINDOW) -> int:
    """Steps averaged at each end: ``window``, at most a third of the run (so the two windows are apart)."""
    return max(1, min(window, n_steps // 3 or 1))


def metric_trend(log_dir: Path, key: str, window: int = REWARD_SUMMARY_WINDOW) -> tuple[int, float | None, float | None]:
    """(training steps logged, mean of ``key`` over the first ``reward_window`` steps, over the last) from
    metrics.jsonl; the means are None when no step logged ``key``."""
    # step 0 is the validation before training (no reward): not a training step
    rows = [r for r in read_metrics(Path(log_dir) / METRICS_FILE) if int(r["step"]) > 0]
    values = [r[key] for r in rows if key in r]
    if not values:
        return len(rows), None, None
    first, last = first_last_means(values, reward_window(len(values), window))
    return len(rows), first, last


def reward_trend(log_dir: Path, window: int = REWARD_SUMMARY_WINDOW) -> tuple[int, float | None, float | None]:
    """(steps logged, mean reward of the first ``window`` steps, of the last ``window`` steps) from metrics.jsonl."""
    return metric_trend(log_dir, REWARD_KEY, window)


def validation_trend(log_dir: Path) -> list[tuple[int, float, int]]:
    """``(step, val/all/em, val/n)`` of every validation pass logged in metrics.jsonl, in step order."""
    rows = read_metrics(Path(log_dir) / METRICS_FILE)
    return [(int(r["step"]), float(r["val/all/em"]), int(r.get("val/n", 0))) for r in rows if "val/all/em" in r]


# ---------------------------------------------------------------- preparation (tiny assets, index)


def prepare_tiny_assets(cfg) -> Path | None:
    """Generate the offline tiny assets under ``paths.tiny_assets`` if the config uses them (idempotent).

    The warm-started SFT model is generated only when a model path of the config points at it.
    """
    root = cfg.paths.tiny_assets
    if not root:
        return None
    from rlinf_ext.assets.tiny import make_tiny_assets

    root = Path(root)
    with_sft = "qwen2-tiny-sft" in str(cfg.rollout.model.model_path)
    started = time.monotonic()
    print(f"[launch] tiny assets: {root} (warm-started SFT model: {'yes' if with_sft else 'no'})", flush=True)
    make_tiny_assets(root, seed=0, with_sft=with_sft)
    print(f"[launch] tiny assets ready in {time.monotonic() - started:.1f} s", flush=True)
    return root


def cli_command(*args: str) -> list[str]:
    """``rlinf-ext ARGS`` run with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "rlinf_ext.cli", *args]


def run_step(what: str, command: list[str], log_path: Path) -> None:
    """Run one preparation command (index build, conversion) with its output in ``log_path``.

    A failure becomes a LaunchError that names the step, the command and the tail of its output.
    """
    import subprocess

    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[launch] {what}: {' '.join(command[3:] if command[:3] == cli_command() else command)}", flush=True)
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    if code != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise LaunchError(f"{what} failed (exit {code}); full log: {log_path}\n{tail}")
    print(f"[launch] {what}: done in {time.monotonic() - started:.1f} s (log: {log_path})", flush=True)


def index_is_built(index_dir: Path) -> bool:
    """An index counts as built when the builder's metadata file is there (written last, so an interrupted
    build does not count; the builder resumes it)."""
    from rlinf_ext.retrieval.metadata import METADATA_NAME

    return (index_dir / METADATA_NAME).is_file()


def ensure_index(cfg) -> None:
    """Build ``retrieval.index_dir`` from ``retrieval.corpus_path`` when the run launches a server and it is missing."""
    r = cfg.retrieval
    if not r.launch or not r.index_dir:
        return
    index_dir = Path(r.index_dir)
    if index_is_built(index_dir):
        print(f"[launch] retrieval index: {index_dir} (already built)", flush=True)
        return
    command = cli_command("build-index", "--corpus", str(r.corpus_path), "--out", str(index_dir),
                          "--retriever", str(r.retriever))
    if r.model_path:
        command += ["--model", str(r.model_path)]
    run_step(f"retrieval index ({r.retriever})", command, run_dir(cfg) / "logs" / "build_index.log")


# ---------------------------------------------------------------- retrieval server


@dataclass
class LaunchedServer:
    """The retrieval server this run started: where it listens and how to find its process."""

    address: str  # host:port
    pid: int
    log_path: Path


@contextlib.contextmanager
def retrieval_server(cfg, startup_timeout: float = 300.0) -> Iterator[LaunchedServer]:
    """Serve ``retrieval.index_dir`` on ``retrieval.host`` (a free port when ``retrieval.port`` is 0) for the run;
    stopped on exit whatever happens."""
    from rlinf_ext.retrieval.launch import RetrievalServerError, RetrievalServerProcess

    r = cfg.retrieval
    log_path = run_dir(cfg) / "logs" / "retrieval_server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = RetrievalServerProcess(
        r.index_dir, r.corpus_path, pages=r.pages_path, host=str(r.host), port=int(r.port), topk=int(r.topk),
        model=r.model_path, retriever=str(r.retriever), max_batch_size=int(r.max_batch_size),
        max_wait_ms=float(r.max_wait_ms), startup_timeout_s=startup_timeout, log_path=log_path,
    )
    started = time.monotonic()
    try:
        try:
            url = process.start()
        except RetrievalServerError as exc:
            raise LaunchError(f"retrieval server failed to start (log: {log_path}): {exc}") from exc
        server = LaunchedServer(url.removeprefix("http://"), process.pid, log_path)
        print(f"[launch] retrieval server on {url} (pid {server.pid}, up in {time.monotonic() - started:.1f} s, "
              f"log: {log_path})", flush=True)
        yield server
    finally:
        process.stop()


# ---------------------------------------------------------------- checkpoint conversion


def megatron_checkpoint_exists(path: Path) -> bool:
    return (path / "latest_checkpointed_iteration.txt").is_file()


def convert_hf_to_megatron(cfg) -> Path | None:
    """``actor.megatron.use_hf_ckpt``: convert the HF model once; a finished earlier conversion is reused."""
    mg = cfg.actor.megatron
    if not mg.use_hf_ckpt:
        return None
    conv = mg.ckpt_convertor
    out = Path(conv.save_path)
    if megatron_checkpoint_exists(out):
        print(f"[launch] HF -> Megatron: {out} (already converted)", flush=True)
        return out
    command = cli_command("convert", "hf2mg", "--hf", str(conv.hf_model_path), "--out", str(out),
                          "--tp", str(conv.tensor_model_parallel_size), "--pp", str(conv.pipeline_model_parallel_size),
                          "--quiet")
    run_step("HF -> Megatron conversion", command, run_dir(cfg) / "logs" / "convert_hf2mg.log")
    return out


def checkpoints_root(cfg) -> Path:
    return run_dir(cfg) / "checkpoints"


def convert_last_checkpoint_to_hf(cfg) -> tuple[Path | None, Path | None]:
    """mg2hf on the newest complete ``global_step_N/actor``; returns (checkpoint dir, HF dir).

    The actor saves in Megatron's torch layout (tracker file + ``iter_N/mp_rank_XX/model_optim_rng.pt``),
    so the converter reads the checkpoint directory as is.
    """
    from rlinf_ext.engines.checkpoint import latest_complete_checkpoint

    ckpt = latest_complete_checkpoint(checkpoints_root(cfg))
    if ckpt is None:
        print(f"[launch] no complete checkpoint under {checkpoints_root(cfg)}; nothing to convert", flush=True)
        return None, None
    out = run_dir(cfg) / "hf_model" / ckpt.name
    if (out / "config.json").is_file():
        print(f"[launch] Megatron -> HF: {out} (already converted)", flush=True)
        return ckpt, out
    actor_dir = ckpt / "actor"
    if not megatron_checkpoint_exists(actor_dir):
        raise LaunchError(
            f"{actor_dir} is not a Megatron checkpoint (no latest_checkpointed_iteration.txt); it was written by an "
            "older version (actor/model.pt). Train again, or convert it with an older rlinf_ext."
        )
    command = cli_command("convert", "mg2hf", "--mg", str(actor_dir), "--out", str(out),
                          "--hf-template", str(cfg.rollout.model.model_path), "--quiet")
    run_step("Megatron -> HF conversion", command, run_dir(cfg) / "logs" / "convert_mg2hf.log")
    return ckpt, out


# ---------------------------------------------------------------- training


def use_launched_server(cfg, address: str) -> None:
    """Point the search tool at the server this run launched; ``retrieval.launch`` goes off so that no
    component downstream starts a second one."""
    cfg.tools.search.server_addr = address
    cfg.retrieval.launch = False


def launch_groups(cfg, cluster, total_train_steps: int):
    """``groups.launch_worker_groups`` with start-up failures turned into one LaunchError."""
    from rlinf_ext.runner.groups import WorkerStartupError, launch_worker_groups

    started = time.monotonic()
    try:
        worker_groups = launch_worker_groups(cfg, cluster, total_train_steps=total_train_steps,
                                             search_server_addr=cfg.tools.search.server_addr)
    except WorkerStartupError as exc:
        raise LaunchError(f"{exc.component} workers failed to start: {exc.cause}") from exc
    except Exception as exc:
        raise LaunchError(f"worker groups failed to start: {type(exc).__name__}: {exc}") from exc
    print(f"[launch] worker groups up in {time.monotonic() - started:.1f} s", flush=True)
    return worker_groups


def build_datasets(cfg):
    """Tokenised train / validation prompts (the trainer's dataset class); over-long prompts are dropped."""
    from transformers import AutoTokenizer

    from rlinf_ext.runner.trainer import PromptDataset, load_jsonl_prompts

    data = cfg.data
    tokenizer = AutoTokenizer.from_pretrained(str(cfg.rollout.model.model_path))

    def dataset(paths):
        rows = load_jsonl_prompts(list(paths), data.prompt_key, data.answer_key, int(data.data_size))
        return PromptDataset(rows, tokenizer, int(data.max_prompt_length))

    try:
        train_ds = dataset(data.train_data_paths)
        val_ds = dataset(data.val_data_paths) if data.val_data_paths else None
    except (ValueError, OSError) as exc:
        raise LaunchError(f"data: {exc}") from exc
    print(f"[launch] data: {len(train_ds)} training prompts ({train_ds.dropped} over data.max_prompt_length dropped)"
          + (f", {len(val_ds)} validation prompts" if val_ds is not None else ""), flush=True)
    return train_ds, val_ds


def train(cfg, cluster) -> dict:
    """Launch the groups, run the trainer with the metrics sink, return the trainer's summary."""
    from rlinf_ext.runner.groups import WorkerCallError, stop_worker_groups
    from rlinf_ext.runner.metrics import sink_from_config
    from rlinf_ext.runner.trainer import SearchR1Trainer

    train_ds, val_ds = build_datasets(cfg)
    total_steps = SearchR1Trainer.total_steps(cfg, len(train_ds))
    worker_groups = launch_groups(cfg, cluster, total_steps)
    # the trainer draws its own step progress bar; the sink's bar would be a second one
    sink = sink_from_config(cfg, total_steps=total_steps, show_progress=False)
    trainer = None
    try:
        trainer = SearchR1Trainer(cfg, worker_groups, train_ds, val_ds, on_step=sink)
        try:
            trainer.init_workers()
        except WorkerCallError as exc:
            raise LaunchError(f"{exc.component} workers failed to initialise: {exc.cause}") from exc
        try:
            return trainer.run() or {}
        except WorkerCallError as exc:
            raise LaunchError(f"training stopped: {exc}") from exc
    finally:
        if trainer is not None:
            with contextlib.suppress(Exception):  # workers may already be dead; Ray shutdown follows anyway
                trainer.shutdown()
        # kill the workers now so that RLinf's threads still waiting on their calls fail fast before Ray stops
        stop_worker_groups(worker_groups)
        sink.close()


# ---------------------------------------------------------------- evaluation after training


def eval_config_for(config: str | os.PathLike) -> Path | None:
    """The sibling ``<name>-eval.yaml`` of a training YAML, if there is one."""
    from rlinf_ext.config.compose import find_experiment

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
    from rlinf_ext.eval.runner import run_evaluation

    overrides = [f"rollout.model.model_path={hf_dir}", f"runner.output_dir={out_dir.parent}",
                 f"runner.experiment_name={out_dir.name}", *extra_overrides]
    if server_address:
        overrides += [f"tools.search.server_addr={server_address}", "retrieval.launch=false"]
    cfg = load_checked_config(eval_yaml, overrides, check_paths=True)
    print(f"[launch] evaluating {hf_dir} with {eval_yaml.name}", flush=True)
    try:
        # print_table=False: run_training prints this table itself at the very end (once)
        result = run_evaluation(cfg, show_progress=show_progress, print_table=False)
    except Exception as exc:
        raise LaunchError(f"evaluation of {hf_dir} failed: {type(exc).__name__}: {exc}") from exc
    from rlinf_ext.eval.results import RESULTS_MD

    table = Path(result.run_dir) / RESULTS_MD
    return table if table.exists() else None


# ---------------------------------------------------------------- the whole run


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
    if not show_progress:
        os.environ["TQDM_DISABLE"] = "1"  # every tqdm bar of this process (trainer, evaluation, conversion)
    print_plan(cfg)
    summary = RunSummary(experiment=str(cfg.runner.experiment_name))
    with stop_on_signals(), contextlib.ExitStack() as stack:
        tiny_root = prepare_tiny_assets(cfg)
        ensure_index(cfg)
        cfg = load_checked_config(config, overrides, check_paths=True)  # paths now exist or are real errors
        server = stack.enter_context(retrieval_server(cfg)) if cfg.retrieval.launch else None
        if server is not None:
            use_launched_server(cfg, server.address)
        convert_hf_to_megatron(cfg)
        with rlinf_cluster(cfg) as cluster:
            trainer_summary = train(cfg, cluster)
        summary.extra.update(trainer_summary)
        summary.checkpoint_dir, summary.hf_model_dir = convert_last_checkpoint_to_hf(cfg)
        summary.log_dir = Path(cfg.runner.logger.log_path)
        plot = summary.log_dir / "reward_curve.png"
        summary.plot_path = plot if plot.exists() else None
        summary.rollout_data_dir = Path(cfg.runner.rollout_data_dir) if cfg.runner.rollout_data_dir else None
        summary.steps, summary.first_reward, summary.last_reward = reward_trend(summary.log_dir)
        summary.reward_window = reward_window(summary.steps)
        _, first_searches, last_searches = metric_trend(summary.log_dir, SEARCHES_KEY)
        if first_searches is not None:
            summary.searches = (first_searches, last_searches)
        summary.validations = validation_trend(summary.log_dir)
        eval_yaml = eval_config_for(config)
        if evaluate is None:
            evaluate = eval_yaml is not None and tiny_root is not None
        eval_error: LaunchError | None = None
        if evaluate and summary.hf_model_dir is not None:
            try:
                if eval_yaml is None:
                    raise LaunchError(f"evaluation asked for, but there is no {Path(str(config)).stem}-eval.yaml")
                summary.eval_table = evaluate_after_training(
                    eval_yaml, summary.hf_model_dir, server.address if server else None, run_dir(cfg) / "eval",
                    ([f"paths.tiny_assets={tiny_root}"] if tiny_root else []) + list(eval_overrides), show_progress,
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


def check_evaluation_backend(cfg) -> None:
    """Refuse, before anything starts, a ``rollout.rollout_backend`` that ``rlinf-ext eval`` cannot run here.

    ``hf``: the in-process CPU engine. ``sglang``: an in-process SGLang engine on this node's GPUs
    (``engines/sglang_generator.py``; needs a CUDA device and the GPU extras). ``vllm``: refused.
    """
    backend = str(cfg.rollout.rollout_backend)
    if backend == "hf":
        return
    if backend == "sglang":
        import torch

        from rlinf_ext.engines.sglang_generator import (
            GPU_INSTALL_FIX,
            SGLangUnavailable,
            engine_kwargs,
            sglang_installed,
            usable_gpus,
        )

        if not torch.cuda.is_available():
            raise LaunchError(
                "rollout.rollout_backend='sglang' evaluates on GPUs, but no CUDA device is visible here. Fix: run "
                f"`rlinf-ext eval` on a GPU node with the GPU extras ({GPU_INSTALL_FIX}), or set "
                "rollout.rollout_backend=hf to evaluate on CPU."
            )
        if not sglang_installed():
            raise LaunchError(
                f"rollout.rollout_backend='sglang': sglang is not installed. Fix: {GPU_INSTALL_FIX}, or set "
                "rollout.rollout_backend=hf to evaluate on CPU."
            )
        try:  # GPUs placed vs visible, TP size, precision: known before anything starts
            engine_kwargs(cfg, usable_gpus(cfg, torch.cuda.device_count()))
        except SGLangUnavailable as exc:
            raise LaunchError(f"rollout: {exc}") from exc
        return
    raise LaunchError(
        f"rollout.rollout_backend={backend!r}: `rlinf-ext eval` runs the hf (CPU) or sglang (GPU) engine only; "
        "vLLM evaluation is not implemented. Fix: set rollout.rollout_backend=sglang (GPU) or hf (CPU)."
    )


def start_evaluation_generator(cfg):
    """The contract-§2 generator ``rlinf-ext eval`` passes to ``run_evaluation``: None for ``hf`` (it builds
    the CPU engine itself), a started ``SGLangEngineGenerator`` for ``sglang`` (the caller closes it)."""
    if str(cfg.rollout.rollout_backend) != "sglang":
        return None
    from rlinf_ext.engines.sglang_generator import SGLangEngineGenerator, SGLangUnavailable

    try:
        return SGLangEngineGenerator.from_config(cfg)
    except SGLangUnavailable as exc:
        raise LaunchError(f"rollout: {exc}") from exc
    except Exception as exc:  # SGLang's own start-up failures (CUDA OOM, bad model dir, ...)
        raise LaunchError(f"rollout: the SGLang engine failed to start: {type(exc).__name__}: {exc}") from exc


def run_evaluation_only(config: str | os.PathLike, overrides: Sequence[str] = (), show_progress: bool = True):
    """``rlinf-ext eval``: validate, start a retrieval server when the YAML asks, start the generation engine
    (sglang: in-process on this node's GPUs; hf: built by ``run_evaluation``), evaluate, stop everything."""
    from rlinf_ext.eval.runner import run_evaluation

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
            server = stack.enter_context(retrieval_server(cfg))
            use_launched_server(cfg, server.address)
        generator = start_evaluation_generator(cfg)
        if generator is not None:
            stack.enter_context(generator)  # engine.shutdown() on the way out: success, error or Ctrl-C
        result = run_evaluation(cfg, generator=generator, show_progress=show_progress)
    print(f"[launch] evaluation results: {result.run_dir}", flush=True)
    return result
