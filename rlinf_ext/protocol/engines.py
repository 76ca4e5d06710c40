"""The engine registry: given ``rollout.rollout_backend``, the one place that names everything an engine brings.

An entry (``EngineSpec``) holds the engine's facts (the devices it runs on, its weight-sync route per placement,
what its log-probs are, what it can evaluate, what installs it) and names its parts by import path
(``"module:attr"``), imported only when asked for (``spec.load("rollout_worker")``), so that validating a config
reads the facts without importing torch, vLLM or SGLang.

``engine_spec(cfg)`` is the one reader of the key outside the schema: every other module asks the entry's facts
instead of comparing the name. The refusals live in ``config/rules/hardware.py`` (validate) and read the same facts.
The parts, each called with the experiment config:

- ``rollout_worker``: the training rollout's RLinf worker class (``workers/rollout_*.py``);
- ``generator`` / ``vl_generator``: ``fn(cfg) -> Generator`` of ``rlinf-ext eval`` for a text / a vision-language
  agent ("" = that evaluation is not built for this engine).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

from rlinf_ext.protocol.plugins import load_path

ENGINE_KEY = "rollout.rollout_backend"
HF, VLLM, SGLANG = "hf", "vllm", "sglang"

# The SGLang profile: the release the SGLang code is written against (generation/sglang_*.py,
# workers/rollout_sglang.py) and the command that installs it (setup.py's `sglang` extra)
SGLANG_VERSION = "0.5.23"
SGLANG_INSTALL = "bash scripts/install.sh --sglang"


class EngineError(ValueError):
    """A ``rollout.rollout_backend`` that names no engine, or asks one for a part it lacks: problem and ``fix``."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem} Fix: {fix}")
        self.problem, self.fix = problem, fix


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot start here (not installed, no device, a config it cannot serve); names the fix."""


@dataclass(frozen=True)
class EngineSpec:
    name: str  # the value of rollout.rollout_backend
    title: str
    devices: tuple[str, ...]  # "cpu", "gpu": where its rollout runs
    rollout_worker: str
    generator: str
    vl_generator: str
    collocated_route: str  # GPU weight sync, actor and engine on the same GPUs (sync/, models/memory.py)
    disaggregated_route: str  # GPU weight sync, on disjoint GPUs
    install: str  # the command that installs its profile on a GPU node ("" = the CPU install has it)
    profile: str  # what that profile holds, for messages
    packages: tuple[str, ...] = ()  # what a GPU run imports (found without importing: sglang initialises CUDA)
    saver_packages: tuple[str, ...] = ()  # also needed to release its GPU to a collocated actor (CUDA graphs on)
    pinned: str = ""  # the one release its code is written against ("" = setup.py's range)
    dtype_key: str = "rollout.model.precision"  # the key that sets the dtype it holds weights in
    concurrency_key: str = "rollout.max_running_requests"  # the key that caps the sequences it runs at once
    memory_model: str = ""  # models/memory.py's engine_memory model ("" = not planned: CPU only)
    seeds_each_request: bool = True  # reproducible sampling without serving one request at a time (else its
    # worker takes deterministic=)
    partial_rollout: bool = False  # a sync can cut its turns in flight (runner.partial_rollout)
    recounts_image_pads: bool = True  # it expands image pads itself, so its prompt counts can differ from the loop's
    started_by_launcher: bool = False  # `rlinf-ext eval` starts it (engine subprocesses) and shuts it down
    eval_preflight: str = ""  # fn(cfg) -> None: EngineUnavailable when `rlinf-ext eval` cannot start it here
    logprobs: str = ""  # what it returns as a sampled token's log-prob with top-k / top-p / a penalty on

    @property
    def install_fix(self) -> str:
        return f"{self.install} ({self.profile})"

    def runs_on(self, gpu: bool) -> bool:
        return ("gpu" if gpu else "cpu") in self.devices

    def route(self, collocated: bool) -> str:
        return self.collocated_route if collocated else self.disaggregated_route

    def evaluates(self, vision: bool) -> bool:
        return bool(self.vl_generator if vision else self.generator)

    def load(self, part: str) -> Any:
        """The object a part field names (``spec.load("rollout_worker")``), imported now."""
        path = getattr(self, part)
        if not path:
            raise EngineError(f"{ENGINE_KEY}={self.name!r} has no {part}.", f"choose another {ENGINE_KEY}.")
        return load_path(path, f"engine {self.name!r} part {part}")


ENGINES: dict[str, EngineSpec] = {  # in the order a fix suggests them
    VLLM: EngineSpec(
        name=VLLM,
        title="vLLM",
        devices=("cpu", "gpu"),
        rollout_worker="rlinf_ext.workers.rollout_vllm:VLLMRolloutWorker",
        generator="rlinf_ext.generation.vllm_engine:VLLMGenerator.from_config",
        vl_generator="rlinf_ext.generation.vllm_vl:VLLMVLGenerator.from_config",
        collocated_route="ipc",
        disaggregated_route="nccl",  # vLLM's weight-transfer engines (sync/vllm_transfer.py)
        install="bash scripts/install.sh --gpu",
        profile="the gpu extra: vllm 0.32.0, Transformer Engine",
        packages=("vllm",),
        memory_model="vllm",
        partial_rollout=True,  # its keep pause stops the turns in flight; they go on after the sync (vllm_engine.py)
        logprobs="the log-probs of its processed distribution (generation/vllm_wire.py: "
        "logprobs_mode=processed_logprobs, after the penalty and the top-k / top-p truncation), which the "
        "actor's recompute never applies",
    ),
    HF: EngineSpec(
        name=HF,
        title="transformers (CPU)",
        devices=("cpu",),
        rollout_worker="rlinf_ext.workers.rollout_hf:HFRolloutWorker",
        generator="rlinf_ext.generation.hf:HFGenerator.from_config",
        vl_generator="rlinf_ext.generation.hf_vl:HFVLGenerator.from_config",
        collocated_route="paired",
        disaggregated_route="broadcast",
        install="",
        profile="the CPU install",
        dtype_key="rollout.hf.dtype",
        concurrency_key="rollout.hf.max_batch_size",
        seeds_each_request=False,
        partial_rollout=True,  # it stops between decode steps (generation/hf.py: SyncPending)
        recounts_image_pads=False,  # the loop's own processor builds its inputs
        logprobs="log_softmax(raw logits / temperature) (generation/hf.py: output_logits), before the repetition "
        "penalty and the top-k / top-p filters it samples with: not the distribution it sampled from",
    ),
    SGLANG: EngineSpec(
        name=SGLANG,
        title="SGLang",
        devices=("gpu",),
        rollout_worker="rlinf_ext.workers.rollout_sglang:SGLangRolloutWorker",
        generator="rlinf_ext.generation.sglang_engine:SGLangEngineGenerator.from_config",
        vl_generator="",  # its image path is not built for evaluation
        collocated_route="paired",
        disaggregated_route="distributed",  # sync/weight_sync.py, sync/sglang_transfer.py
        install=SGLANG_INSTALL,
        profile=f"the SGLang profile: sglang {SGLANG_VERSION} on torch 2.14.1, Transformer Engine",
        packages=("sglang",),
        saver_packages=("torch_memory_saver",),
        pinned=SGLANG_VERSION,
        memory_model="sglang",
        started_by_launcher=True,
        # partial rollout not wired: its gate waits for the turns, one version per reply (0.5.23's
        # TokenizerManager.pause_generation(mode="retract") and per-token weight_versions spans are the way to it)
        eval_preflight="rlinf_ext.generation.sglang_engine:check_evaluation_engine",
        logprobs="log_softmax(logits / temperature) after its penalties and before its top-k / top-p filters "
        "(SGLANG_RETURN_ORIGINAL_LOGPROB off): neither the distribution it sampled from nor the actor's",
    ),
}


def engine_spec(cfg_or_name: Any) -> EngineSpec:
    """The entry of an engine: a registered name, or an experiment config (its ``rollout.rollout_backend``)."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else str(cfg_or_name.rollout.rollout_backend)
    if name not in ENGINES:
        raise EngineError(f"{ENGINE_KEY}={name!r} is not a registered engine.", f"choose one of {sorted(ENGINES)}.")
    return ENGINES[name]


def engines_with(fact: str) -> list[str]:
    """The names of the engines whose ``fact`` is true (for messages: "only hf's")."""
    return [name for name, spec in ENGINES.items() if getattr(spec, fact)]


def engine_dtype(cfg: Any) -> str:
    """The dtype name the chosen engine holds its weights in (the value of its ``dtype_key``)."""
    return str(read_key(cfg, engine_spec(cfg).dtype_key))


def read_key(cfg: Any, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def installed_version(package: str) -> str | None:
    """An installed package's version, read from its metadata (importing sglang initialises CUDA); None if absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_packages(spec: EngineSpec, saver: bool) -> list[str]:
    """What a GPU run of this engine needs and cannot find (``saver``: it must also release its GPU); the pinned
    package counts as missing at any other release."""
    needed = [*spec.packages, *(spec.saver_packages if saver else ())]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if spec.pinned and spec.packages[0] not in missing and installed_version(spec.packages[0]) != spec.pinned:
        missing.append(f"{spec.packages[0]}=={spec.pinned}")
    return missing


def make_generator(cfg: Any, vision: bool) -> Any:
    """The chosen engine's evaluation ``Generator`` (text, or vision-language with ``vision``), started now."""
    spec = engine_spec(cfg)
    if not spec.evaluates(vision):
        able = [n for n, s in ENGINES.items() if s.evaluates(vision)]
        raise EngineError(
            f"{ENGINE_KEY}={spec.name!r}: {spec.title} does not evaluate a "
            f"{'vision-language' if vision else 'text'} agent (only {', '.join(able)}).",
            f"set {ENGINE_KEY}={able[0]}.",
        )
    return spec.load("vl_generator" if vision else "generator")(cfg)
