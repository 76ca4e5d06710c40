"""`rollout.rollout_backend=sglang` is refused until the SGLang profile on its current release is built.

The GPU extra installs vLLM 0.32.0 (torch 2.13.0, transformers 5.19.0); the 2025 SGLang stack (sglang 0.4.6.post5
on torch 2.6.0 and transformers 4.51.1) is gone, and sglang 0.5.23 (torch 2.14.1) is not installed or built yet.
These tests run without the `sglang_rules_lifted` fixture other modules use for the SGLang code kept meanwhile.
"""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config


def test_sglang_is_refused_until_its_current_profile_is_built(reference_env):
    for name in ("qwen2.5-3b-tool-1node", "qwen2.5-3b-tool-1node-eval", "qwen2.5-vl-7b-1node"):
        issues = [i for i in check_config(name, ["rollout.rollout_backend=sglang"]).issues
                  if i.key == "rollout.rollout_backend"]
        assert len(issues) == 1, [str(i) for i in issues]
        text = f"{issues[0].reason} {issues[0].fix}"
        assert "SGLang profile on its current release" in text and "not installed or built yet" in text
        assert "rollout.rollout_backend=vllm" in issues[0].fix
    assert check_config("tiny-cpu").ok  # the CPU profile (hf) is untouched


def test_the_launcher_refuses_sglang_before_starting_anything(reference_env, monkeypatch):
    from rlinf_ext.runner import launch
    from rlinf_ext.runner.errors import LaunchError

    def must_not_run(*_a, **_k):
        raise AssertionError("started preparing the run before refusing the rollout backend")

    monkeypatch.setattr(launch, "prepare_tiny_assets", must_not_run)
    monkeypatch.setattr(launch, "run_evaluation", must_not_run)
    with pytest.raises(LaunchError, match=r"rollout.rollout_backend: sglang: the SGLang profile on its current"):
        launch.run_evaluation_only("qwen2.5-3b-tool-1node-eval", ["rollout.rollout_backend=sglang"],
                                   show_progress=False)
