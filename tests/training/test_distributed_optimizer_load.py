"""`load_parameter_state_keeping_steps`: Megatron's distributed-optimizer load copies every per-parameter state
key from its file (param, exp_avg, exp_avg_sq), and torch's AdamW also keeps a per-parameter `step`; on an H100
the load raised KeyError: 'step' (scripts/gpu_smoke.py S3). A recording stand-in for Megatron's chained
optimizer that loads the way Megatron 0.16.1's `_set_main_param_and_optimizer_states` does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from megatron.core.optimizer.optimizer import ChainedOptimizer

from rlinf_ext.training.optimizer import load_parameter_state_keeping_steps
from tests.support.signature_checks import checked_against


class MegatronLikeOptimizer:
    """`chained_optimizers[i].optimizer.state` as torch's AdamW holds it; `load_parameter_state` (spelled and
    checked as Megatron's ``ChainedOptimizer``'s) copies every key of each state from the file's tensors, as
    Megatron does."""

    def __init__(self, file_tensors: dict[str, torch.Tensor], fail: bool = False):
        self.adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
        param = self.adam.param_groups[0]["params"][0]
        self.adam.state[param] = {"step": torch.tensor(7.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
        self.chained_optimizers = [SimpleNamespace(optimizer=self.adam)]
        self.file_tensors, self.fail, self.loaded_from = file_tensors, fail, None

    @checked_against(ChainedOptimizer.load_parameter_state)
    def load_parameter_state(self, filename, *, update_legacy_format=False) -> None:
        self.loaded_from = filename
        if self.fail:
            raise RuntimeError("broken file")
        for state in self.adam.state.values():
            for key in state:
                state[key].copy_(self.file_tensors[key])  # KeyError on a key the file lacks


FILE = {"param": torch.ones(3), "exp_avg": torch.full((3,), 2.0), "exp_avg_sq": torch.full((3,), 3.0)}


def test_the_stand_in_fails_like_megatron_without_the_helper():
    with pytest.raises(KeyError, match="step"):
        MegatronLikeOptimizer(FILE).load_parameter_state("f")


def test_moments_load_and_the_step_is_kept(tmp_path):
    opt = MegatronLikeOptimizer(FILE)
    load_parameter_state_keeping_steps(opt, tmp_path / "distrib_optim.pt")
    (state,) = opt.adam.state.values()
    assert opt.loaded_from == str(tmp_path / "distrib_optim.pt")
    assert state["exp_avg"].tolist() == [2.0] * 3 and state["exp_avg_sq"].tolist() == [3.0] * 3
    assert float(state["step"]) == 7.0 and list(state) == ["exp_avg", "exp_avg_sq", "step"]


def test_the_step_is_put_back_when_the_load_fails():
    opt = MegatronLikeOptimizer(FILE, fail=True)
    with pytest.raises(RuntimeError, match="broken file"):
        load_parameter_state_keeping_steps(opt, Path("x"))
    (state,) = opt.adam.state.values()
    assert float(state["step"]) == 7.0
