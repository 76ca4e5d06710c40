"""The GRPO policy on Megatron-core, in-process (wrapped by ``workers/actor.py``): the Megatron model under
``training/grpo_policy.py:GRPOPolicy``'s steps, following RLinf's ``MegatronActor``.

Weights come from the HF checkpoint through the conversion mapping in memory; old and reference (frozen copy)
log-probs are recomputed on the trajectory ids, chunked from hidden states (``training/logprobs.py``); a rollout
batch gives ``algorithm.n_minibatches`` optimizer steps over ``actor.micro_batch_size`` micro-batches. Gradients and
the step: ``training/optimizer.py``; precision: ``training/precision.py`` (Megatron's mixed precision on CUDA, NOT
GPU-verified; fp32 masters with autocast on CPU). Collocated GPU runs ``offload``/``onload`` between phases (no-ops
on CPU). Also: ``training/data_parallel.py``, ``training/policy_io.py`` (checkpoints), ``training/settings.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from megatron.core import parallel_state

from rlinf_ext.convert.hf_files import HFReader
from rlinf_ext.convert.mapping import ConvertSpec
from rlinf_ext.convert.state_dicts import hf_to_megatron, megatron_to_hf
from rlinf_ext.models.cpu_shims import init_parallel_state
from rlinf_ext.models.dtypes import autocast_dtype
from rlinf_ext.models.megatron import (
    build_gpt_model,
    causal_padding_mask,
    hidden_states_only,
    layer_spec_uses_te,
    load_megatron_state_dict,
    output_projection,
)
from rlinf_ext.training import policy_io
from rlinf_ext.training.batching import PackedBatch, pack_sequences
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.grpo_policy import GRPOPolicy, Sample
from rlinf_ext.training.logprobs import next_token_logprobs
from rlinf_ext.training.optimizer import build_step, offload_weights, wrap_ddp
from rlinf_ext.training.precision import MixedPrecision, move_module_, release_device_memory
from rlinf_ext.training.settings import ActorSettings


class MegatronPolicy(GRPOPolicy):
    """Policy + frozen reference on Megatron-core (TP=PP=1 in this process), with its optimizer.

    One data-parallel rank when ``parallel_state`` was initialised for several processes before it is built
    (every rank holds the whole model; ``train_step`` sums token counts and gradients over the ranks)."""

    def __init__(self, hf_model_path: str | Path, settings: ActorSettings, *, init_distributed: bool = True):
        self.settings = settings
        self.hf_model_path = str(hf_model_path)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        native = self.device.type == "cuda"  # Megatron's mixed precision (16-bit params) on CUDA, autocast on CPU
        compute_dtype = autocast_dtype(settings.precision) or torch.float32
        self.params_dtype = compute_dtype if native else torch.float32
        self.amp = MixedPrecision("fp32" if native else settings.precision, self.device, settings.loss_scale)
        self._weights_offloaded = False
        if init_distributed and not parallel_state.model_parallel_is_initialized():
            init_parallel_state(1, 1, seed=settings.seed)
        # DP = the processes of an already initialised group (the Ray worker initialises it for N ranks)
        self.dp = DataParallel.from_parallel_state()
        torch.manual_seed(settings.seed)
        self.spec = ConvertSpec.from_hf_config(self.hf_model_path, te_layernorm_names=False)
        mg_state = hf_to_megatron(HFReader(self.hf_model_path).read_all(), self.spec, tp=1, pp=1)[(0, 0)]
        self.model = self._build(mg_state, trainable=True, dtype=self.params_dtype)
        # the frozen reference only runs forward passes: stored in the compute dtype (half the memory)
        self.ref_model = None
        if settings.loss.kl_beta > 0:
            self.ref_model = self._build(mg_state, trainable=False, dtype=compute_dtype)
        del mg_state
        self.ddp = wrap_ddp(self.model, settings, self.device)
        self.step = build_step(self.ddp, settings, self.dp, self.amp, self.device, self.params_dtype)
        self.optimizer_steps = 0

    def _build(self, mg_state: dict[str, torch.Tensor], trainable: bool, dtype: torch.dtype) -> torch.nn.Module:
        overrides = dict(self.settings.model_overrides, calculate_per_token_loss=True)  # DDP sums: optimizer.py
        model = build_gpt_model(
            self.hf_model_path,
            params_dtype=dtype,
            init_weights=False,
            use_te=layer_spec_uses_te(self.settings.spec_name),
            **overrides,
        )
        load_megatron_state_dict(model, mg_state, source=f"HF checkpoint {self.hf_model_path}")
        model.to(self.device)
        model.requires_grad_(trainable)
        model.train(trainable)
        return model

    @property
    def pad_id(self) -> int:
        return 0

    def gradients(self) -> dict[str, torch.Tensor]:
        """This rank's accumulated gradients by Megatron name (DDP keeps them in ``main_grad``)."""
        return {n: p.main_grad for n, p in self.model.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ forward passes
    def _inputs(self, model: torch.nn.Module, batch: PackedBatch):
        ids = batch.input_ids.to(self.device)
        b, t = ids.shape
        # Right padding: the causal mask alone keeps real tokens from seeing padding.
        mask = None if getattr(model, "uses_te_spec", False) else causal_padding_mask(None, t, b).to(self.device)
        return ids, batch.position_ids.to(self.device), mask

    def _token_logprobs(self, model: torch.nn.Module, batch: PackedBatch, with_entropy: bool = False):
        """(log-probs ``[B, T-1]`` of the sampling distribution (logits / temperature), entropy or None), fp32,
        in chunks of ``actor.logprob_chunk_tokens`` over the sequence."""
        ids, pos, mask = self._inputs(model, batch)
        with self.amp.autocast():
            with hidden_states_only(model):
                hidden = model(ids, pos, mask)
            return next_token_logprobs(
                output_projection(model),
                hidden,
                ids,
                temperature=self.settings.temperature,
                chunk_tokens=self.settings.logprob_chunk_tokens,
                with_entropy=with_entropy,
            )

    def _pack(self, samples: Sequence[Sample]) -> PackedBatch:
        return pack_sequences(
            [s.prompt_ids for s in samples],
            [s.response_ids for s in samples],
            [s.response_mask for s in samples],
            self.pad_id,
        )

    # ------------------------------------------------------------------ weights
    def megatron_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items() if torch.is_tensor(v)}

    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy weights under HF names (conversion mapping), for the rollout engine; floating-point
        tensors cast to ``dtype`` (the rollout's) when given, else the model's own parameters (fp32 master
        weights on CPU, the 16-bit weights the optimizer maintains on CUDA)."""
        state = {k: v for k, v in self.megatron_state_dict().items() if not k.endswith("._extra_state")}
        hf = megatron_to_hf({(0, 0): state}, self.spec)
        if dtype is not None:
            hf = {k: v.to(dtype) if v.is_floating_point() else v for k, v in hf.items()}
        return hf

    @torch.no_grad()
    def probe_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[1, L, V]`` of the model's own weights without autocast on the probe ``ids [1, L]``:
        the reference the rollout's logits are checked against after a weight sync."""
        batch = pack_sequences([ids[0, :1].tolist()], [ids[0, 1:].tolist()], [[1] * (ids.shape[1] - 1)], 0)
        offloaded = self._weights_offloaded
        if offloaded:  # collocated: bring the weights for the probe only, then give the GPU back
            offload_weights(self.ddp, to_cpu=False, device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            inputs = self._inputs(self.model, batch)
            logits = self.model(*inputs, runtime_gather_output=True)
            logits = logits[..., : self.model.hf_vocab_size].float().cpu()
        finally:
            self.model.train(was_training)
            if offloaded:
                offload_weights(self.ddp, to_cpu=True, device=self.device)
                release_device_memory(self.device)
        return logits

    # ------------------------------------------------------------------ offload (collocated GPU runs)
    def offload(self, weights: bool | None = None, optimizer: bool | None = None, grads: bool | None = None) -> None:
        """Move weights (policy + reference), optimizer state and the gradient buffer off the GPU (defaults:
        ``actor.offload_weight / offload_optimizer / offload_grad``) and free the cache. CPU actor: no-op."""
        if self.device.type != "cuda":
            return
        s = self.settings
        weights = s.offload_weight if weights is None else weights
        if weights and not self._weights_offloaded:
            offload_weights(self.ddp, to_cpu=True, device=self.device)
            if self.ref_model is not None:
                move_module_(self.ref_model, torch.device("cpu"), pin_memory=True)
            self._weights_offloaded = True
        self.step.offload(
            optimizer=s.offload_optimizer if optimizer is None else optimizer,
            grads=s.offload_grad if grads is None else grads,
        )
        release_device_memory(self.device)

    def onload(self) -> None:
        """Undo ``offload`` (no-op when nothing is offloaded)."""
        if self.device.type != "cuda":
            return
        if self._weights_offloaded:
            offload_weights(self.ddp, to_cpu=False, device=self.device)
            if self.ref_model is not None:
                move_module_(self.ref_model, self.device)
            self._weights_offloaded = False
        self.step.onload()

    @property
    def offloaded(self) -> bool:
        return self._weights_offloaded or bool(getattr(self.step, "_offloaded", False))

    # ------------------------------------------------------------------ checkpoints (training/policy_io.py)
    def save(self, directory: str | Path, iteration: int) -> Path | None:
        """Megatron's legacy layout in ``directory``; call on every data-parallel rank (rank 0 writes).
        Returns the rank file on rank 0, None elsewhere."""
        return policy_io.save_policy(self, directory, iteration)

    def load(self, directory: str | Path) -> int:
        """Restore weights, optimizer, LR-schedule position and RNG; returns the checkpoint's iteration."""
        return policy_io.load_policy(self, directory)
