"""The resolved DictConfig is accepted by RLinf 0.3.0's own reasoning-config validation."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlinf_ext.config import load_config, to_dictconfig

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


@pytest.mark.timeout(120)
def test_rlinf_validate_reasoning_cfg_accepts_reference(reference_env):
    import rlinf.config as rlinf_config  # a hard dependency: a failed import must fail the test

    cfg = to_dictconfig(load_config("qwen2.5-3b-tool-1node"))
    OmegaConf.set_struct(cfg, True)  # as RLinf's validate_cfg does: unknown reads would raise
    out = rlinf_config.validate_reasoning_cfg(cfg)
    assert out.actor.global_batch_size == 512 * 4 // 2
    assert out.actor.micro_batch_size == 1
    assert out.rollout.sglang.attention_backend == "triton"
    assert out.rollout.model.model_type == "qwen2.5"
