"""Saving and restoring an ``FSDPPolicy``: the HF model directory is the checkpoint's weights and the export.

Layout of ``<global_step_N>/actor/`` (the run directory around it, its completion marker over every file and
the atomic rename, is ``runner/checkpoints.py``)::

    config.json, generation_config.json, model*.safetensors     what transformers loads (no conversion step)
    preprocessor_config.json, tokenizer files, chat template    the processor, so the directory is self-contained
    training_state.pt   {"iteration", "optimizer", "opt_param_scheduler", "rng_state"[per DP rank]}
    hf_actor.json       {"format", "iteration"}: written last; a directory without it is refused

Every data-parallel rank calls both functions (the FSDP2 gathers are collective); rank 0 writes. Weights and
optimizer state are whole tensors, so a checkpoint resumes on any number of ranks (torch's full-state-dict load
shards them). Files are written to a temporary name and renamed, so a crash never leaves a half-written file
under its final name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rlinf_ext.training.checkpoint import capture_rng_state, restore_rng_state
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.policy_io import scheduler_state
from rlinf_ext.training.settings import ActorSettings

HF_ACTOR_FORMAT = "hf-vl"
MARKER = "hf_actor.json"
TRAINING_STATE = "training_state.pt"
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPPolicy(Protocol):
    """What this module reads of ``training/fsdp_policy.py:FSDPPolicy`` (which imports this module)."""

    settings: ActorSettings
    dp: DataParallel
    model: torch.nn.Module
    step: Any  # fsdp_policy.FSDPStep
    processor: Any
    optimizer_steps: int
    hf_model_path: str

    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]: ...


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_fsdp_policy(policy: FSDPPolicy, directory: str | Path, iteration: int) -> Path | None:
    """Write the HF model directory plus training state into ``directory``; returns it on rank 0."""
    if int(iteration) < 1:
        raise ValueError(f"actor checkpoint iteration must be >= 1 (the rollout step), got {iteration}")
    directory = Path(directory)
    weights = policy.hf_state_dict()  # collective under FSDP2
    optimizer = get_optimizer_state_dict(policy.model, policy.step.optimizer, options=_FULL)  # collective
    rng = policy.dp.gather_objects(capture_rng_state())
    if policy.dp.rank != 0:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).unlink(missing_ok=True)
    policy.model.save_pretrained(directory, state_dict=weights, safe_serialization=True)
    # save_pretrained records the class it was called on; an FSDP2 module is a generated subclass
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = [ARCHITECTURE]
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    policy.processor.save_pretrained(directory)
    _atomic_torch_save(
        {
            "iteration": int(iteration),
            "optimizer": optimizer,
            "opt_param_scheduler": scheduler_state(policy),
            "rng_state": rng,
        },
        directory / TRAINING_STATE,
    )
    marker = {"format": HF_ACTOR_FORMAT, "iteration": int(iteration), "hf_model_path": policy.hf_model_path}
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=1) + "\n")
    os.replace(tmp, directory / MARKER)
    return directory


def _check_dir(directory: Path) -> dict[str, Any]:
    if not (directory / MARKER).is_file():
        raise ValueError(
            f"{directory} is not a complete HF actor checkpoint (no {MARKER}: interrupted while writing, "
            "or not written by the fsdp actor); point runner.resume_dir at a global_step_N/ the trainer "
            "saved, or use resume_dir: auto to pick the newest complete one"
        )
    marker = json.loads((directory / MARKER).read_text())
    if marker.get("format") != HF_ACTOR_FORMAT:
        raise ValueError(
            f"{directory / MARKER}: format {marker.get('format')!r}, expected {HF_ACTOR_FORMAT!r} "
            "(a Megatron actor checkpoint cannot resume the fsdp actor)"
        )
    return marker


def to_module_names(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names -> the model's parameter names. transformers 5's ``save_pretrained`` writes Qwen2.5-VL in
    the checkpoint layout (``visual.*``, ``model.layers.*``) while the module holds ``model.visual.*`` and
    ``model.language_model.*``. The renamings are the ones ``from_pretrained`` applied when it built this model
    (kept on it as ``_weight_conversions``, which ``save_pretrained`` reverts): looking them up again by class
    would find none under FSDP2, whose ``fully_shard`` swaps the class for a generated ``FSDP<Name>`` that
    transformers takes for custom code, so a checkpoint saved unsharded would not load sharded. Renamings only:
    a conversion that also transforms tensors is refused."""
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    transforms = getattr(model, "_weight_conversions", None)
    if transforms is None:
        raise ValueError(
            f"{type(model).__name__} has no _weight_conversions: the actor's model is built with "
            "from_pretrained (training/fsdp_policy.py:load_vl_model), which records them"
        )
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    if len(renamings) != len(transforms):
        raise NotImplementedError(
            f"{type(model).__name__}: its checkpoint conversion transforms tensors, "
            "not only names; load it with from_pretrained"
        )
    return {rename_source_key(name, renamings, [])[0]: tensor for name, tensor in weights.items()}


def _embedding_name(model: torch.nn.Module) -> str:
    embedding = model.get_input_embeddings()
    return next(n for n, m in model.named_modules() if m is embedding) + ".weight"


def load_fsdp_policy(policy: FSDPPolicy, directory: str | Path) -> int:
    """Restore weights, optimizer, LR-schedule position and RNG; returns the checkpoint's iteration."""
    from safetensors.torch import load_file

    directory = Path(directory)
    _check_dir(directory)
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(shard))
    weights = to_module_names(policy.model, weights)
    if "lm_head.weight" not in weights and policy.model.config.tie_word_embeddings:
        weights["lm_head.weight"] = weights[_embedding_name(policy.model)]  # tied: saved once
    set_model_state_dict(policy.model, weights, options=StateDictOptions(full_state_dict=True))
    state = torch.load(directory / TRAINING_STATE, weights_only=False, map_location="cpu")
    set_optimizer_state_dict(
        policy.model, policy.step.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
    )
    policy.optimizer_steps = int(state["opt_param_scheduler"]["num_steps"])
    rng = state["rng_state"]
    restore_rng_state(rng[policy.dp.rank] if policy.dp.rank < len(rng) else rng[0])
    return int(state["iteration"])
