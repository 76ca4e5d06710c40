"""The reference configs' collocated layout scaled down to a CPU: actor and rollout on the same two ranks
(``actor: 0-1, rollout: 0-1``, as ``configs/cluster/1node-8gpu.yaml``'s ``actor,rollout: all``). Two actor
processes of RLinf's group form one torch.distributed group over gloo; each has its own vLLM CPU engine in a
rollout process (in-place layerwise reload), fed by its own actor rank along the ``paired`` route. The engines
start from perturbed weights, so an engine passes its probe (the actor's logits against its own prompt log-probs)
only if its actor rank sent it the whole model: one sync, then one probe per engine.

- the Megatron text actor (``MegatronPolicy``: every rank holds the whole model and converts it to HF names);
- the FSDP2 vision-language actor (``FSDPPolicy`` sharded over the two ranks: every rank all-gathers each tensor
  itself, ``FSDPPolicy.iter_hf_weights``), with activation checkpointing on as in the 7B config.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from trainer_helpers import kill_group, make_cfg

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
COLLOCATED = "{actor: 0-1, rollout: 0-1, reward: 0}"
ENGINE_KV_BYTES = 32 << 20  # per engine: the probe is one short sequence
BUCKET = 256 << 10  # several buckets, so several acknowledgements, per sync


def perturbed_copy(model_cls, src, dst, seed: int):
    """``src`` copied to ``dst`` with N(0, 0.1) noise added to every weight: the engines' start, so a weight that
    the sync does not deliver leaves the engine's logits off the actor's."""
    shutil.copytree(src, dst)
    model = model_cls.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst)
    return dst


def sync_two_ranks(actor_cfg, rollout_cfg, cluster) -> tuple[list[dict], list[dict]]:
    """Launch 2 actor ranks and 2 vLLM rollout ranks, pair them, run one sync with its probe; returns what each
    actor rank sent and each rollout rank's state."""
    from rlinf_ext.runner.groups import cpu_strategy, wait_all_or_raise, wait_or_raise
    from rlinf_ext.sync.weight_sync import SyncRoutes
    from rlinf_ext.workers.actor import ActorWorker
    from rlinf_ext.workers.rollout_vllm import VLLMRolloutWorker

    actor = ActorWorker.create_group(actor_cfg, 1).launch(
        cluster, placement_strategy=cpu_strategy(2), name=actor_cfg.actor.group_name
    )
    rollout = VLLMRolloutWorker.create_group(rollout_cfg).launch(
        cluster, placement_strategy=cpu_strategy(2), name=rollout_cfg.rollout.group_name
    )
    try:
        for handle, name in [(actor.init_worker(), "actor"), (rollout.init_worker(), "rollout")]:
            wait_or_raise(handle, name, "init_worker", startup=True)
        assert [s["weight_version"] for s in rollout.get_state().wait()] == [0, 0]  # the initial weights
        routes = SyncRoutes("paired", actor_world=2, rollout_dp=2)
        wait_or_raise(actor.set_weight_sync(routes, BUCKET), "actor", "set_weight_sync")
        wait_or_raise(rollout.set_weight_sync(routes), "rollout", "set_weight_sync")
        sent, _ = wait_all_or_raise(
            [
                (actor.sync_model_to_rollout(True), "actor", "sync_model_to_rollout"),
                (rollout.sync_model_from_actor(), "rollout", "sync_model_from_actor"),
            ]
        )
        return sent, rollout.get_state().wait()
    finally:
        kill_group(actor, rollout)


def check_each_engine_has_its_ranks_weights(sent: list[dict], states: list[dict]) -> None:
    # a failed probe raises in sync_model_from_actor (WeightSyncError); this states what passing means
    for rank, state in enumerate(states):
        assert state["last_sync"]["sources"] == [rank], state
        assert state["last_sync_logprob_gap"] is not None and state["last_sync_logprob_gap"] < 1e-4, state
        assert state["last_sync"]["buckets"] == sent[rank]["buckets"] > 1
        assert state["last_sync"]["tensor_bytes"] == sent[rank]["tensor_bytes"] == sent[0]["tensor_bytes"]
    assert all(s["mode"] == "paired" and s["wire_bytes"] * 20 < s["tensor_bytes"] for s in sent)  # handles only


def test_megatron_actor_ranks_each_sync_their_own_engine(tiny_assets, tmp_path, cluster):
    from transformers import AutoModelForCausalLM

    model = tiny_assets.qwen2_tiny
    common = {
        "cluster.component_placement": COLLOCATED,
        "rollout.rollout_backend": "vllm",
        "rollout.vllm.kv_cache_memory_bytes": ENGINE_KV_BYTES,
    }
    start = perturbed_copy(AutoModelForCausalLM, model, tmp_path / "engine-start", seed=3)
    actor_cfg, rollout_cfg = (
        make_cfg(tiny_assets, tmp_path, "http://127.0.0.1:1", **common, **{"rollout.model.model_path": str(path)})
        for path in (model, start)
    )
    check_each_engine_has_its_ranks_weights(*sync_two_ranks(actor_cfg, rollout_cfg, cluster))


def test_fsdp2_vl_actor_ranks_each_sync_their_own_engine(tiny_mm_assets_sft, tmp_path, cluster):
    """Before the fix, only rank 0 had the weights (torch's full state dict with ``cpu_offload``: ``{}`` on the
    others): engine 1 got none, kept its start weights and failed its probe."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from rlinf_ext.config.loader import load_config

    model = tiny_mm_assets_sft.mm.qwen2_5_vl_tiny_sft  # head size 32: vLLM's CPU attention takes it
    start = perturbed_copy(Qwen2_5_VLForConditionalGeneration, model, tmp_path / "engine-start", seed=3)

    def cfg(model_path):
        overrides = {
            "paths.tiny_assets": str(tiny_mm_assets_sft.root),
            "runner.output_dir": str(tmp_path),
            "cluster.component_placement": COLLOCATED,
            "rollout.model.model_path": str(model_path),
            "rollout.vllm.kv_cache_memory_bytes": ENGINE_KV_BYTES,
            "retrieval.launch": "false",
            "tools.search.server_addr": "127.0.0.1:1",
            "actor.fsdp_config.gradient_checkpointing": "true",
        }
        return load_config("tiny-mm-cpu", [f"{k}={v}" for k, v in overrides.items()])

    check_each_engine_has_its_ranks_weights(*sync_two_ranks(cfg(model), cfg(start), cluster))
