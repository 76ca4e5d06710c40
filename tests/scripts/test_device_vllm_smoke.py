"""scripts/device_vllm_smoke.sh's guards for the lent device: it stops before copying or installing anything on a
machine whose Python or torch the carried wheels do not fit, and each device call's carry (the checkout plus one
part) leaves a margin under the call's limit."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device_vllm_smoke.sh"
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def setting(name: str) -> str:
    found = re.search(rf"^{name}=(\S+)", SCRIPT.read_text(), re.M)
    assert found, f"{SCRIPT.name} sets no {name}"
    return found.group(1)


def run_on_device(tmp_path: Path, command: str, python: str, torch: str) -> subprocess.CompletedProcess:
    """The script's ``command`` with a python3 on PATH that reports ``python`` and ``torch``, in a copy of the
    checkout that holds no carried parts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n%s\\n' {python} {torch}\n")
    fake.chmod(0o755)
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    (tmp_path / "repo" / "scripts" / SCRIPT.name).write_text(SCRIPT.read_text())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    return subprocess.run(
        ["bash", str(tmp_path / "repo" / "scripts" / SCRIPT.name), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["part1", "part2", "rerun"])
@pytest.mark.parametrize("python,torch", [("3.11", "2.11.0+cu130"), ("3.12", "2.13.0+cpu")])
def test_another_python_or_torch_stops_the_call_before_anything_is_copied(tmp_path, command, python, torch):
    done = run_on_device(tmp_path, command, python, torch)
    assert done.returncode == 1
    assert f"this machine has Python {python} and torch {torch}" in done.stderr
    assert "need Python 3.12 and torch 2.11.x: nothing was installed" in done.stderr
    assert "no .whl" not in done.stderr and not (tmp_path / "out").exists()


def test_the_device_the_wheels_were_built_for_passes_the_check(tmp_path):
    done = run_on_device(tmp_path, "part1", "3.12", "2.11.0+cu130")
    assert "device: Python 3.12, torch 2.11.0+cu130" in done.stdout
    assert "no .whl1/vllm.part.aa" in done.stderr  # the next guard: this copy carries no part


def test_the_checkout_and_the_first_part_leave_the_margin_of_a_device_call():
    part = int(setting("PART_BYTES")[:-1]) * UNITS[setting("PART_BYTES")[-1]]
    limit, margin = int(setting("CALL_LIMIT")), int(setting("CALL_MARGIN"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    checkout = sum((REPO / name).stat().st_size for name in tracked.decode().split("\0") if (REPO / name).is_file())
    assert margin >= 4 << 20
    assert part + checkout + margin <= limit, (part, checkout, margin, limit)
