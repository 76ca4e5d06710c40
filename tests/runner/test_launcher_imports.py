"""The launcher process (the Ray driver) never trains or generates: importing it must not load the training and
generation stacks. Every launch, and every ``rlinf-ext train`` that stops at config validation, would pay ~10 s
for them; the workers import them in their own processes, where they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter per test (~5 s each on 2 cores)

REPO = Path(__file__).resolve().parents[2]

# top-level packages only a worker (or the evaluation at the end of a run) needs
HEAVY = ("megatron", "transformers", "vllm", "sglang", "bm25s", "numba", "wandb")
LAUNCHER_MODULES = ("rlinf_ext.runner.launch", "rlinf_ext.runner.commands", "rlinf_ext.cli")


def loaded_after_import(modules: tuple[str, ...]) -> list[str]:
    """The ``HEAVY`` packages in ``sys.modules`` of a fresh interpreter after importing ``modules``."""
    code = (
        f"import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_launcher_imports_no_training_or_generation_stack():
    assert loaded_after_import(LAUNCHER_MODULES) == []


def test_the_check_sees_a_heavy_import():
    # the same probe on a module that does need transformers: the empty list above is not a broken probe
    assert "transformers" in loaded_after_import(("rlinf_ext.generation.hf",))
