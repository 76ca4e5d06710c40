"""The launcher's evaluation wiring: the table is printed once; `rlinf-ext eval` refuses a backend it cannot
run here before it starts anything, and with sglang runs one engine (a fake here) that it always shuts down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlinf_ext.generation import sglang_engine as sglang_generator
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.runner import launch
from rlinf_ext.runner.errors import LaunchError
from tests.support.sglang_fakes import RecordingEngine
from tests.support.signature_checks import checked_against

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REPO = Path(__file__).resolve().parents[2]
EVAL_YAML = REPO / "examples" / "searchr1" / "config" / "tiny-cpu-eval.yaml"


def cuda_answering(real, answer):
    """A CUDA query of torch (``is_available``, ``device_count``: what needs a GPU) answering ``answer``, checked
    against torch's own signature."""
    return checked_against(real)(lambda *args, **kwargs: answer)


def test_evaluation_after_training_leaves_the_table_to_the_launcher(tiny_assets_registry, tmp_path, monkeypatch):
    tiny_assets = tiny_assets_registry  # tiny-cpu-eval.yaml validates on the registry world's held-out file
    calls = []

    def fake_run_evaluation(cfg, generator=None, **kwargs):
        calls.append(kwargs)
        out = tmp_path / "eval"
        out.mkdir(exist_ok=True)
        (out / "results.md").write_text("| table |\n")
        return SimpleNamespace(run_dir=out)

    monkeypatch.setattr(launch, "evaluate_agent", fake_run_evaluation)
    table = launch.evaluate_after_training(
        EVAL_YAML,
        Path(tiny_assets.qwen2_tiny),
        "127.0.0.1:1",
        tmp_path / "eval",
        [f"paths.tiny_assets={tiny_assets.root}"],
        show_progress=False,
    )
    assert table == tmp_path / "eval" / "results.md"
    # run_training prints results.md itself at the end; run_evaluation must not print it a first time
    assert len(calls) == 1 and calls[0].get("print_table") is False


def reference_eval_env(monkeypatch):
    for var in ("RLINF_EXT_SEARCHR1_DATA", "RLINF_EXT_EVAL_MODEL", "RLINF_EXT_RETRIEVER_ADDR"):
        monkeypatch.setenv(var, "/nonexistent" if "ADDR" not in var else "127.0.0.1:1")

    def must_not_run(*_a, **_k):
        raise AssertionError("started preparing the run before refusing the rollout backend")

    monkeypatch.setattr(launch, "prepare_tiny_assets", must_not_run)
    monkeypatch.setattr(launch, "evaluate_agent", must_not_run)
    monkeypatch.setattr(sglang_generator, "load_engine_class", must_not_run)


def test_sglang_eval_without_cuda_is_refused_before_anything_starts(monkeypatch):
    reference_eval_env(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", cuda_answering(torch.cuda.is_available, False))
    with pytest.raises(
        LaunchError, match=r"rollout_backend='sglang'.*no CUDA device.*bash scripts/install\.sh --sglang"
    ):
        launch.run_evaluation_only(
            "qwen2.5-3b-tool-1node-eval", ["rollout.rollout_backend=sglang"], show_progress=False
        )


def test_sglang_eval_without_sglang_names_the_install(monkeypatch):
    reference_eval_env(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", cuda_answering(torch.cuda.is_available, True))
    monkeypatch.setattr(sglang_generator, "sglang_installed", lambda: False)
    with pytest.raises(LaunchError, match=r"sglang is not installed\. Fix: bash scripts/install\.sh --sglang"):
        launch.run_evaluation_only(
            "qwen2.5-3b-tool-1node-eval", ["rollout.rollout_backend=sglang"], show_progress=False
        )


def test_sglang_eval_with_too_few_visible_gpus_is_refused(monkeypatch):
    reference_eval_env(monkeypatch)  # the reference places the rollout on all 8 GPUs of the node
    monkeypatch.setattr(torch.cuda, "is_available", cuda_answering(torch.cuda.is_available, True))
    monkeypatch.setattr(torch.cuda, "device_count", cuda_answering(torch.cuda.device_count, 4))
    monkeypatch.setattr(sglang_generator, "sglang_installed", lambda: True)
    with pytest.raises(LaunchError, match=r"GPUs 0-7, but only 4 CUDA device"):
        launch.run_evaluation_only(
            "qwen2.5-3b-tool-1node-eval", ["rollout.rollout_backend=sglang"], show_progress=False
        )


def test_vllm_eval_of_the_vision_language_agent_starts_the_vl_engine(monkeypatch):
    """``rollout_backend: vllm`` evaluates MMSearch-R1 on vLLM's VL engine (``generation/vllm_vl.py``: the entry's
    ``vl_generator``), SGLang is refused with the fix. The engine start is recorded, not run: this process has
    loaded bm25s (numba), beside which vLLM's CPU engine cannot start; the real start is in
    tests/generation/test_vllm_vl.py."""
    from rlinf_ext.config import load_config
    from rlinf_ext.eval.core.runner import EvalError, build_generator
    from rlinf_ext.generation.vllm_vl import VLLMVLGenerator

    started = []
    monkeypatch.setattr(
        VLLMVLGenerator, "start", classmethod(lambda cls, options, **kw: started.append((cls, options, kw)) or "engine")
    )
    cfg = load_config(
        "tiny-mm-cpu-eval", ["rollout.rollout_backend=vllm", "rollout.model.model_path=/m/vl"], strict=False
    )
    assert build_generator(cfg, vision=True) == "engine"
    ((cls, options, kw),) = started
    assert cls is VLLMVLGenerator and options.model_path == "/m/vl" and options.in_process
    assert kw == {"seed": int(cfg.runner.seed), "return_logprobs": bool(cfg.rollout.return_logprobs)}
    cfg.rollout.rollout_backend = "sglang"
    with pytest.raises(EvalError, match="rollout_backend=vllm"):
        build_generator(cfg, vision=True)


def test_a_direct_evaluation_refuses_the_engine_the_launcher_owns():
    """``run_evaluation(cfg)`` without a generator on SGLang: its engine subprocesses are the launcher's to stop."""
    from rlinf_ext.config import load_config
    from rlinf_ext.eval.core.runner import EvalError, build_generator

    cfg = load_config("tiny-cpu-eval", ["rollout.rollout_backend=sglang"], strict=False)
    with pytest.raises(EvalError, match="pass a started SGLang generator"):
        build_generator(cfg, vision=False)


class FakeEngine(RecordingEngine):
    """sglang's ``Engine(**kwargs)``: its calls checked against sglang 0.5.23's (tests/support/sglang_fakes.py; the kwargs
    build its real ServerArgs in tests/generation/test_sglang.py)."""

    def __init__(self, source, **kwargs):
        super().__init__(source)
        self.kwargs = kwargs
        self.requests = []

    async def reply(self, arguments):
        self.requests.append((arguments["input_ids"], arguments["sampling_params"]))
        return {
            "text": "<answer> z</answer>",
            "output_ids": [2004, 220, 89, 2005],
            "meta_info": {"finish_reason": {"type": "stop", "matched": "</answer>"}},
        }


@pytest.mark.parametrize("fails", [False, True])
def test_sglang_eval_runs_on_one_engine_and_shuts_it_down(tiny_assets_registry, monkeypatch, fails, sglang_source):
    tiny_assets = tiny_assets_registry  # tiny-cpu-eval.yaml validates on the registry world's held-out file
    engines: list[FakeEngine] = []
    monkeypatch.setattr(torch.cuda, "is_available", cuda_answering(torch.cuda.is_available, True))
    monkeypatch.setattr(torch.cuda, "device_count", cuda_answering(torch.cuda.device_count, 2))
    monkeypatch.setattr(sglang_generator, "sglang_installed", lambda: True)
    monkeypatch.setattr(
        sglang_generator,
        "load_engine_class",
        lambda: lambda **kw: engines.append(FakeEngine(sglang_source, **kw)) or engines[-1],
    )
    monkeypatch.setattr(launch, "prepare_tiny_assets", lambda cfg: None)
    monkeypatch.setattr(launch, "ensure_index", lambda cfg: None)
    seen = {}

    def fake_run_evaluation(cfg, generator=None, **kwargs):
        assert isinstance(generator, sglang_generator.SGLangEngineGenerator)
        assert engines and engines[0].shutdowns == 0  # started before, still running during the evaluation
        seen["result"] = asyncio.run(generator.generate([1, 2], SamplingParams(do_sample=False, stop=["</answer>"])))
        if fails:
            raise RuntimeError("evaluation broke")
        return SimpleNamespace(run_dir="somewhere")

    monkeypatch.setattr(launch, "evaluate_agent", fake_run_evaluation)
    overrides = [
        f"paths.tiny_assets={tiny_assets.root}",
        f"rollout.model.model_path={tiny_assets.qwen2_tiny}",
        "rollout.rollout_backend=sglang",
        "cluster.num_gpus_per_node=2",
        "retrieval.launch=false",
        "tools.search.server_addr=127.0.0.1:1",
    ]
    if fails:
        with pytest.raises(RuntimeError, match="evaluation broke"):
            launch.run_evaluation_only("tiny-cpu-eval", overrides, show_progress=False)
    else:
        launch.run_evaluation_only("tiny-cpu-eval", overrides, show_progress=False)
    assert len(engines) == 1 and engines[0].shutdowns == 1  # shut down on success and on failure
    assert engines[0].kwargs["model_path"] == str(tiny_assets.qwen2_tiny) and engines[0].kwargs["tp_size"] == 1
    assert engines[0].kwargs["dp_size"] == 1  # tiny-cpu-eval places the rollout on GPU 0 only
    assert seen["result"].finish_reason == "stop" and seen["result"].text == "<answer> z</answer>"
    assert engines[0].requests[0][1]["temperature"] == 0.0 and engines[0].requests[0][1]["stop"] == ["</answer>"]
