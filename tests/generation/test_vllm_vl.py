"""The vLLM vision-language checks (``vllm_vl_checks.py``) in an interpreter of their own: vLLM's Transformers
backend, the VL engine on CPU, decorates transformers' Qwen2.5-VL classes in place, after which building an HF
Qwen2.5-VL model in the same process fails ("Current vLLM config is not set"); the rest of the session builds them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

CHECKS = Path(__file__).with_name("vllm_vl_checks.py")
N_CHECKS = 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_vl_checks_pass_in_their_own_interpreter():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS)],
        cwd=CHECKS.parents[2],
        capture_output=True,
        text=True,
        timeout=840,
    )
    tail = proc.stdout[-8000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert re.search(rf"\b{N_CHECKS} passed\b", proc.stdout), tail  # every check ran: none skipped or deselected
    print(tail[-1500:])
