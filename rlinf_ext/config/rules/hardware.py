"""Hardware rules: the rollout backend fits the cluster, and ``rollout_backend: sglang`` finds the SGLang
profile installed (``SGLANG_VERSION``, read by the SGLang engine and worker too)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


# The SGLang profile: the release the SGLang code is written against (generation/sglang_*.py,
# workers/rollout_sglang.py) and the command that installs it (setup.py's `sglang` extra)
SGLANG_VERSION = "0.5.23"


SGLANG_INSTALL = "bash scripts/install.sh --sglang"


def installed_sglang() -> str | None:
    """The installed sglang's version, read from its metadata (importing sglang initialises CUDA); None if absent."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@rule("rollout.rollout_backend")
def sglang_profile_installed(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """``rollout_backend: sglang`` needs the SGLang profile (sglang 0.5.23 on torch 2.14.1) on this machine: the
    SGLang code speaks that release's ``Engine`` API, and the vLLM profile (torch 2.13.0) cannot hold it."""
    if cfg.rollout.rollout_backend != "sglang":
        return
    found = installed_sglang()
    if found != SGLANG_VERSION:
        have = "sglang is not installed here" if found is None else f"sglang {found} is installed here"
        yield ConfigIssue(
            "rollout.rollout_backend",
            f"sglang needs the SGLang profile (sglang {SGLANG_VERSION} on torch 2.14.1, transformers 5.19.0), but "
            f"{have}.",
            f"on the GPU node run `{SGLANG_INSTALL}` (into its own virtual environment: it replaces vLLM's torch "
            "2.13.0), or set rollout.rollout_backend=vllm on GPUs (rollout.rollout_backend=hf on CPU).",
        )


@rule("cluster.num_gpus_per_node", "rollout.rollout_backend")
def backend_fits_hardware(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_gpus_per_node == 0 and cfg.rollout.rollout_backend == "sglang":
        yield ConfigIssue(
            "rollout.rollout_backend",
            f"{cfg.rollout.rollout_backend} needs GPUs but the cluster has none (cluster.num_gpus_per_node=0).",
            "set rollout.rollout_backend=hf for a CPU run, or use a GPU cluster profile.",
        )


FUSED_KERNEL_SWITCHES = ("apply_rope_fusion", "bias_dropout_fusion", "bias_activation_fusion", "persist_layer_norm",
                         "gradient_accumulation_fusion")


@rule(*(f"actor.model.{key}" for key in FUSED_KERNEL_SWITCHES), "cluster.num_gpus_per_node")
def no_fused_kernels_on_cpu(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    if cfg.cluster.num_gpus_per_node > 0:
        return
    for key in FUSED_KERNEL_SWITCHES:
        if getattr(cfg.actor.model, key):
            yield ConfigIssue(
                f"actor.model.{key}",
                f"actor.model.{key}=true: fused kernels are CUDA-only; the CPU actor runs Megatron's unfused path.",
                f"set actor.model.{key}=false on a CPU cluster.",
            )
