"""Running the real launcher in a child process as a user does (``rlinf-ext train tiny-cpu ...``), and reading
what it wrote. Shared by the end-to-end tests; not a test module itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]

# a CI-sized tiny experiment: small batches, short generations
CI_SIZE = [
    "data.rollout_batch_size=2",
    "algorithm.group_size=2",
    "algorithm.n_minibatches=1",
    "algorithm.training_batch_size_per_gpu=2",
    "algorithm.sampling_params.max_new_tokens=32",
    "agentloop.response_length_total=192",
    "runner.save_interval=1",
    "runner.val_samples_per_benchmark=1",  # the validation before training: one question per benchmark
]


def launch(
    args: list[str],
    on_line: Callable | None = None,
    timeout: float = 480,
    env: dict[str, str] | None = None,
    config: str = "tiny-cpu",
) -> tuple[int, str]:
    """Run `rlinf-ext train CONFIG --no-progress ARGS`; `on_line(line, proc)` sees each output line as it
    comes. ``env``: the child's environment (default: this one without RAY_ADDRESS)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlinf_ext.cli", "train", config, "--no-progress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    lines: list[str] = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
        return proc.wait(), "".join(lines)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = []
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            pass
    return rows


class StepWatch:
    """Runs an action (in a thread) once metrics.jsonl has a step; ``finish()`` stops watching and returns only
    after an action already started has ended (the launcher can exit while the action still runs: a node being
    stopped is still in ``LocalRayCluster.nodes`` until ``stop_node`` returns)."""

    def __init__(self, run_dir: Path, step: int, action: Callable[[], None]) -> None:
        self._given_up = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(run_dir, step, action), daemon=True)
        self._thread.start()

    def _watch(self, run_dir: Path, step: int, action: Callable[[], None]) -> None:
        while not self._given_up.is_set():
            if any(r.get("step") == step for r in metrics_rows(run_dir)):
                action()
                return
            time.sleep(0.2)

    def finish(self, timeout: float = 120) -> None:
        self._given_up.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the action on a logged step still runs after {timeout} s"


def when_step_logged(run_dir: Path, step: int, action: Callable[[], None]) -> StepWatch:
    """Run ``action`` as soon as metrics.jsonl has ``step`` (the launcher prints nothing between steps, so the file
    is polled); call ``finish()`` on what this returns once the launch is over."""
    return StepWatch(run_dir, step, action)
