"""An invalid config stops the launcher before anything starts; the entry points pass arguments through."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_ext.runner.errors import LaunchError
from rlinf_ext.runner.launch import run_training
from tests.support.signature_checks import checked_against

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "searchr1" / "run_main_searchr1_single.sh"
# a misspelt key and a rule violation that breaks two rules in tiny-cpu (a group of one; 8 trajectories in 2
# minibatches of 4 for a training batch of 8)
BAD = ["runner.max_stepz=3", "algorithm.group_size=1"]


def find_spec_answering(answer):
    """``importlib.util.find_spec`` replaced by ``answer(name, package)``, spelled and checked as the real one."""

    @checked_against(importlib.util.find_spec)
    def find_spec(name, package=None):
        return answer(name, package)

    return find_spec


def test_invalid_config_reports_every_problem_and_starts_nothing(tmp_path, monkeypatch):
    def must_not_run(*_a, **_k):
        raise AssertionError("the launcher went past validation")

    for name in ("prepare_tiny_assets", "ensure_index", "retrieval_server", "rlinf_cluster"):
        monkeypatch.setattr(f"rlinf_ext.runner.launch.{name}", must_not_run)
    monkeypatch.setattr("ray.init", must_not_run)  # nor Ray by another path (the runner tests' own may be up)
    out = tmp_path / "out"
    with pytest.raises(LaunchError) as info:
        run_training("tiny-cpu", [*BAD, f"runner.output_dir={out}", f"paths.tiny_assets={tmp_path / 'assets'}"])
    text = str(info.value)
    assert "3 problem(s)" in text and "nothing was started" in text
    assert "runner.max_stepz" in text and "runner.max_steps" in text  # the suggestion
    assert "algorithm.group_size" in text
    assert not out.exists() and not (tmp_path / "assets").exists()


def _run(cmd, cwd, timeout=60):
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)  # the script must find the repo's .venv or python3 on its own
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_train_exits_1_with_all_errors(tmp_path):
    res = _run([sys.executable, "-m", "rlinf_ext.cli", "train", "tiny-cpu", *BAD], cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert "runner.max_stepz" in res.stderr and "algorithm.group_size" in res.stderr
    assert "Ray cluster up" not in res.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_shell_script_runs_from_any_directory(tmp_path):
    res = _run(["bash", str(SCRIPT), "tiny-cpu", *BAD], cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "runner.max_stepz" in res.stderr
    # only overrides: the default config is the reference run
    res = _run(["bash", str(SCRIPT), "runner.max_stepz=1"], cwd=tmp_path)
    assert res.returncode == 1
    assert "qwen2.5-3b-tool-1node" in res.stderr and "runner.max_stepz" in res.stderr
    res = _run(["bash", str(SCRIPT), "--help"], cwd=tmp_path)
    assert res.returncode == 0 and "CONFIG_NAME" in res.stdout


@pytest.mark.timeout(60)
def test_cli_rejects_a_bare_word_override(tmp_path):
    res = _run([sys.executable, "-m", "rlinf_ext.cli", "train", "tiny-cpu", "max_steps"], cwd=tmp_path)
    assert res.returncode == 2 and "key=value" in res.stderr


def test_options_may_follow_the_overrides():
    import argparse

    from rlinf_ext.runner.commands import add_arguments, pull_flags

    parser = argparse.ArgumentParser()
    add_arguments("train", parser)
    for argv in (
        ["tiny-cpu", "a=1", "--no-eval", "--eval-override", "data.data_size=1", "--no-progress", "b=2"],
        ["--no-progress", "--no-eval", "--eval-override", "data.data_size=1", "tiny-cpu", "a=1", "b=2"],
    ):
        args = parser.parse_args(argv)
        args.overrides = pull_flags(args, args.overrides)
        assert args.config == "tiny-cpu" and args.overrides == ["a=1", "b=2"], argv
        assert args.no_progress and args.evaluate is False and args.eval_override == ["data.data_size=1"], argv
    args = parser.parse_args(["tiny-cpu"])
    args.overrides = pull_flags(args, args.overrides)
    assert args.evaluate is None and args.eval_override == [] and not args.no_progress


def _reference_overrides(tmp_path) -> list[str]:
    """The 8-GPU reference config with placeholder paths (validation without --check-paths needs no files)."""
    return [
        f"rollout.model.model_path={tmp_path / 'model'}",
        f"data.train_data_paths=[{tmp_path / 'train.jsonl'}]",
        f"data.val_data_paths=[{tmp_path / 'val.jsonl'}]",
        "tools.search.server_addr=127.0.0.1:1",
        f"runner.output_dir={tmp_path / 'out'}",
    ]


def test_a_gpu_cluster_without_the_gpu_extra_is_refused_before_anything_starts(tmp_path, monkeypatch):
    import importlib.util

    def must_not_run(*_a, **_k):
        raise AssertionError("the launcher went past the GPU-extra check")

    for name in ("prepare_tiny_assets", "ensure_index", "retrieval_server", "rlinf_cluster", "print_plan"):
        monkeypatch.setattr(f"rlinf_ext.runner.launch.{name}", must_not_run)
    monkeypatch.setattr("ray.init", must_not_run)
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        find_spec_answering(lambda name, package: None if name == "vllm" else found(name, package)),
    )
    with pytest.raises(LaunchError) as info:
        run_training("qwen2.5-3b-tool-1node", _reference_overrides(tmp_path))
    text = str(info.value)
    assert "cluster.num_gpus_per_node=8" in text and "rollout_backend=vllm" in text
    assert "vllm cannot be imported" in text
    assert "bash scripts/install.sh --gpu" in text
    assert not (tmp_path / "out").exists()


def test_the_gpu_extra_check_names_only_what_is_missing(tmp_path, monkeypatch):
    from rlinf_ext.protocol import engines
    from rlinf_ext.runner import services
    from rlinf_ext.runner.prepare import load_checked_config

    cfg = load_checked_config("qwen2.5-3b-tool-1node", _reference_overrides(tmp_path))
    monkeypatch.setattr(engines.importlib.util, "find_spec", find_spec_answering(lambda name, package: None))
    assert services.missing_gpu_packages(cfg) == ["vllm"]
    monkeypatch.setattr(
        engines.importlib.util,
        "find_spec",
        find_spec_answering(lambda name, package: None if name == "vllm" else object()),
    )
    assert services.missing_gpu_packages(cfg) == ["vllm"]
    monkeypatch.setattr(engines.importlib.util, "find_spec", find_spec_answering(lambda name, package: object()))
    assert services.missing_gpu_packages(cfg) == []
    monkeypatch.setattr(engines.importlib.util, "find_spec", find_spec_answering(lambda name, package: None))
    cfg.cluster.num_gpus_per_node = 0  # a CPU cluster needs none of it
    assert services.missing_gpu_packages(cfg) == []


def test_a_launched_retrieval_server_stays_off_the_training_gpus(tmp_path):
    """R6: left to itself the encoder takes cuda:0, the GPU of actor rank 0 and SGLang engine 0."""
    from rlinf_ext.runner.prepare import load_checked_config
    from rlinf_ext.runner.services import retrieval_server_device

    cfg = load_checked_config("qwen2.5-3b-tool-1node", _reference_overrides(tmp_path))
    assert retrieval_server_device(cfg) == (["--device", "cpu"], {"CUDA_VISIBLE_DEVICES": ""})  # all 8 GPUs used
    cfg.cluster.component_placement = {"actor,rollout,reward": "0-6"}
    assert retrieval_server_device(cfg) == (["--device", "cuda"], {"CUDA_VISIBLE_DEVICES": "7"})
    cfg.cluster.num_gpus_per_node = 0
    assert retrieval_server_device(cfg) == ([], {})
