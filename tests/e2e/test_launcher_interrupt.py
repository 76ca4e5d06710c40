"""Ctrl-C during a run: the launcher stops the worker groups, the retrieval server and the Ray instance it
started, and exits 130; no process it started survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(300)
def test_sigint_after_workers_start_stops_everything(tiny_assets, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    args = [
        sys.executable,
        "-m",
        "rlinf_ext.cli",
        "train",
        "tiny-cpu",
        "--no-progress",
        "--no-eval",
        f"paths.tiny_assets={tiny_assets.root}",
        "rollout.model.model_path=${paths.tiny_assets}/models/qwen2-tiny",  # no warm-start needed here
        f"runner.output_dir={tmp_path}",
        "runner.max_steps=50",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(REPO))
    launcher = psutil.Process(proc.pid)
    timer = threading.Timer(280, proc.kill)
    timer.start()
    seen: set[int] = set()
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "[launch] worker groups up" in line:
                break
        assert any("worker groups up" in s for s in lines), "".join(lines)[-3000:]
        time.sleep(2)  # workers are initialising now
        seen = {p.pid for p in launcher.children(recursive=True)}
        assert len(seen) >= 4, "expected the retrieval server, Ray and worker processes"
        proc.send_signal(signal.SIGINT)
        lines += proc.stdout.readlines()
        code = proc.wait(timeout=120)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert code == 130, out[-12000:]
    assert "SIGINT received" in out and "interrupted" in out
    deadline = time.time() + 60
    alive = seen
    while time.time() < deadline:
        alive = {pid for pid in seen if running(pid)}
        if not alive:
            break
        time.sleep(1)
    assert not alive, f"processes left running after Ctrl-C: {sorted(alive)}"
