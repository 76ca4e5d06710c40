"""Hardware rules: the chosen engine runs on the cluster's devices and finds its pinned profile installed (facts of
its entry, ``protocol/engines.py``; the schema's type refuses an unregistered name), and no fused kernel is asked
of a CPU actor."""

from __future__ import annotations

from collections.abc import Iterator

from rlinf_ext.config.rule_registry import rule
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue
from rlinf_ext.protocol import engines
from rlinf_ext.protocol.engines import ENGINE_KEY, ENGINES, engine_spec


@rule(ENGINE_KEY)
def engine_profile_installed(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    """An engine pinned to one release (SGLang: 0.5.23 on torch 2.14.1) needs that release on this machine: its
    code speaks that release's API, and the vLLM profile (torch 2.13.0) cannot hold it."""
    spec = engine_spec(cfg)
    if not spec.pinned:
        return
    package = spec.packages[0]
    found = engines.installed_version(package)
    if found != spec.pinned:
        have = f"{package} is not installed here" if found is None else f"{package} {found} is installed here"
        yield ConfigIssue(
            ENGINE_KEY,
            f"{spec.name} needs {spec.profile}, but {have}.",
            f"on the GPU node run `{spec.install}` (into its own virtual environment: it replaces "
            f"vLLM's torch 2.13.0), or set {ENGINE_KEY}=vllm on GPUs ({ENGINE_KEY}=hf on CPU).",
        )


@rule("cluster.num_gpus_per_node", ENGINE_KEY)
def engine_fits_hardware(cfg: ExperimentConfig) -> Iterator[ConfigIssue]:
    spec = engine_spec(cfg)
    gpus = cfg.cluster.num_gpus_per_node
    if spec.runs_on(gpu=gpus > 0):
        return
    if gpus == 0:
        cpu = [n for n, s in ENGINES.items() if s.runs_on(gpu=False)]
        yield ConfigIssue(
            ENGINE_KEY,
            f"{spec.name} needs GPUs but the cluster has none (cluster.num_gpus_per_node=0).",
            f"set {ENGINE_KEY}={cpu[0]} for a CPU run, or use a GPU cluster profile.",
        )
    else:
        gpu = [n for n, s in ENGINES.items() if s.runs_on(gpu=True)]
        yield ConfigIssue(
            ENGINE_KEY,
            f"{spec.name} runs on CPU only but the cluster has GPUs (cluster.num_gpus_per_node={gpus}).",
            f"set {ENGINE_KEY}={gpu[0]} for a GPU run, or use the CPU profile (cluster.num_gpus_per_node=0).",
        )


FUSED_KERNEL_SWITCHES = (
    "apply_rope_fusion",
    "bias_dropout_fusion",
    "bias_activation_fusion",
    "persist_layer_norm",
    "gradient_accumulation_fusion",
)


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
