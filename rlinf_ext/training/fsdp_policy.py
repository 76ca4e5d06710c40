"""The GRPO policy of the vision-language actor: transformers' Qwen2.5-VL trained with torch (FSDP2 when DP > 1).

Megatron-core 0.16.1 has no Qwen2.5-VL model, so the VL actor is the HF model itself (``actor.training_backend:
fsdp``); the names of its weights are those of the rollout engines, so a weight sync needs no conversion. The GRPO
steps (recompute, advantages, mini-batches in the global order, token-mean loss) are ``training/grpo_policy.py``'s
``GRPOPolicy``; this module supplies the forward pass:

- positions are the model's own 3-D mrope positions (``get_rope_index`` over the whole trajectory, every image
  of the prompt and of the observations), never 1-D aranges;
- banned ids (vision special tokens, padded vocabulary rows) are set to -inf before the log-softmax, and the
  logits divided by the sampling temperature, so the log-probs are those of the distribution sampled from
  (``generation/hf_vl.py`` does the same at sampling time);
- tokens whose target is a banned id (an observation's ``<|image_pad|>`` run) have mask 0 and get log-prob 0.

Data parallelism: each rank holds a ``fully_shard``-ed copy (FSDP2: per vision block, per decoder layer, root).
FSDP2 *averages* gradients over the ranks while the loss is a token-mean over the GLOBAL mini-batch, so the loss is
multiplied by the DP size (``set_gradient_divide_factor(1.0)`` would say it directly, but gloo has no PREMUL_SUM).
Offload between phases (collocated GPUs): ``training/fsdp_policy_offload.py``.
CPU-tested with one process and two gloo ranks; the CUDA path (bf16 parameters with fp32 reduce, activation
checkpointing, offload to CPU) is written the same way and is NOT GPU-verified.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from rlinf_ext.config.schema import FSDPConfig
from rlinf_ext.generation.hf_vl import ImageInputs, load_vl_processor
from rlinf_ext.models.dtypes import dtype_of_precision
from rlinf_ext.protocol.images import ImageRef, canonicalize
from rlinf_ext.protocol.vl_tokens import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    banned_token_ids,
    mrope_positions,
    text_vocab_size,
)
from rlinf_ext.training import fsdp_policy_io
from rlinf_ext.training.batching import PackedBatch, pack_sequences
from rlinf_ext.training.data_parallel import DataParallel
from rlinf_ext.training.fsdp_policy_offload import FSDPOffload
from rlinf_ext.training.grpo_policy import GRPOPolicy, MMSample, Sample
from rlinf_ext.training.logprobs import next_token_logprobs
from rlinf_ext.training.optimizer import StepResult, decay_groups
from rlinf_ext.training.settings import ActorSettings


@dataclass(frozen=True)
class FSDPSettings:
    """``actor.fsdp_config`` of the HF actor, read once (defaults: ``config/schema.py:FSDPConfig``)."""

    freeze_vision_tower: bool
    gradient_checkpointing: bool
    reshard_after_forward: bool
    param_dtype: str  # CUDA only: compute dtype of the parameters; FSDP2 keeps the fp32 shards
    reduce_dtype: str

    @classmethod
    def from_config(cls, fsdp: FSDPConfig | None = None) -> FSDPSettings:
        fsdp = fsdp or FSDPConfig()
        if fsdp.cpu_offload:
            raise ValueError(
                "actor.fsdp_config.cpu_offload=true (FSDP2's CPUOffloadPolicy: parameters always on CPU) "
                "is not implemented; set it false (actor.offload_* moves the actor off the GPUs between "
                "phases instead)."
            )
        return cls(
            bool(fsdp.freeze_vision_tower),
            bool(fsdp.gradient_checkpointing),
            bool(fsdp.reshard_after_forward),
            str(fsdp.mixed_precision.param_dtype),
            str(fsdp.mixed_precision.reduce_dtype),
        )


@dataclass
class MMPackedBatch(PackedBatch):
    attention_mask: torch.Tensor | None = None  # [B, T] 1 on real tokens (right padding)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)  # pixel_values, image_grid_thw


def load_vl_model(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The ViT of a ``Qwen2_5_VLForConditionalGeneration``: ``model.model.visual`` in transformers 5 (the
    ``model.visual`` of 4.x was moved under the inner model)."""
    return model.model.visual


def shard_fsdp2(model: torch.nn.Module, dp: DataParallel, fsdp: FSDPSettings, device: torch.device) -> None:
    """``fully_shard`` each vision block, each decoder layer, then the root (FSDP2's recommended nesting)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(dp.group, device.type)
    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": fsdp.reshard_after_forward}
    if device.type == "cuda":  # NOT GPU-verified
        key = "actor.fsdp_config.mixed_precision."
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=dtype_of_precision(fsdp.param_dtype, key + "param_dtype"),
            reduce_dtype=dtype_of_precision(fsdp.reduce_dtype, key + "reduce_dtype"),
        )
    for block in vision_tower(model).blocks:
        fully_shard(block, **kw)
    for layer in model.model.language_model.layers:  # transformers 5: the decoder is `model.language_model`
        fully_shard(layer, **kw)
    fully_shard(model, **kw)


class FSDPStep:
    """The optimizer step of the HF actor (``training/optimizer.py`` interface): torch AdamW/SGD, clipping."""

    def __init__(self, model: torch.nn.Module, settings: ActorSettings, dp: DataParallel):
        self.model, self.settings, self.dp = model, settings, dp
        self.params = [p for p in model.parameters() if p.requires_grad]
        s, groups = settings, decay_groups(model, settings.weight_decay)
        if s.optimizer == "adam":
            self.optimizer = torch.optim.AdamW(groups, lr=s.lr, betas=(s.adam_beta1, s.adam_beta2), eps=s.adam_eps)
        elif s.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=s.lr)
        else:
            raise ValueError(f"actor.optim.optimizer={s.optimizer!r}; use 'adam' or 'sgd'.")

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        # FSDP2 averages over the ranks; the loss is already divided by the global token count
        return loss * self.dp.size

    def step(self, lr: float) -> StepResult:
        bound = self.settings.clip_grad if self.settings.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, bound)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # DTensor under FSDP2
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ok = bool(torch.isfinite(norm))
        if ok:  # a non-finite gradient skips the update (as the Megatron actor)
            self.optimizer.step()
        return StepResult(ok, float(norm), None)


class FSDPPolicy(GRPOPolicy):
    """Policy (+ frozen reference when ``kl_beta > 0``) as a transformers Qwen2.5-VL model, with its optimizer."""

    def __init__(
        self,
        hf_model_path: str | Path,
        settings: ActorSettings,
        *,
        dp: DataParallel | None = None,
        fsdp: FSDPSettings | None = None,
        banned_ids: Sequence[int] | None = None,
    ):
        self.settings, self.fsdp = settings, fsdp or FSDPSettings.from_config()
        self.hf_model_path = str(hf_model_path)
        self.dp = dp or DataParallel()
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        # FSDP2 over more than one rank, and over a one-rank group when one is given: on CUDA its
        # MixedPrecisionPolicy is what computes in bf16 (scripts/gpu_smoke.py S7 runs that on one GPU)
        self.sharded = self.dp.enabled or self.dp.group is not None
        torch.manual_seed(settings.seed)
        self.processor = load_vl_processor(self.hf_model_path)
        self.model = self._build(trainable=True)
        self.ref_model = self._build(trainable=False) if settings.loss.kl_beta > 0 else None
        vocab = text_vocab_size(self.model.config)
        ids = banned_token_ids(self.processor.tokenizer, vocab) if banned_ids is None else list(banned_ids)
        self.banned = torch.zeros(vocab, dtype=torch.bool)
        self.banned[ids] = True
        self._bias = torch.zeros(vocab).masked_fill(self.banned, float("-inf")).to(self.device)
        self.images = ImageInputs(self.processor.image_processor)
        self.step = FSDPStep(self.model, settings, self.dp)
        self.optimizer_steps = 0
        self._offload = FSDPOffload(self.model, self.ref_model, self.step.optimizer, self.device)

    def _build(self, trainable: bool) -> torch.nn.Module:
        model = load_vl_model(self.hf_model_path).to(self.device)
        model.requires_grad_(trainable)
        if trainable and self.fsdp.freeze_vision_tower:
            vision_tower(model).requires_grad_(False)
        if trainable and self.fsdp.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.sharded:
            shard_fsdp2(model, self.dp, self.fsdp, self.device)
        model.train(trainable)
        return model

    @property
    def pad_id(self) -> int:
        return int(self.processor.tokenizer.pad_token_id)

    def gradients(self) -> dict[str, torch.Tensor]:
        """This rank's gradients by HF name (full tensors: FSDP2 shards are gathered)."""
        out = {}
        for n, p in self.model.named_parameters():
            if p.requires_grad and p.grad is not None:
                g = p.grad
                out[n] = g.full_tensor() if hasattr(g, "full_tensor") else g
        return out

    # ------------------------------------------------------------------ forward passes
    def _pack(self, samples: Sequence[Sample]) -> MMPackedBatch:
        base = pack_sequences(
            [s.prompt_ids for s in samples],
            [s.response_ids for s in samples],
            [s.response_mask for s in samples],
            self.pad_id,
        )
        lengths = [p + r for p, r in zip(base.prompt_lengths, base.response_lengths)]
        attention = (torch.arange(base.input_ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]).long()
        refs = [img for s in samples for img in getattr(s, "images", [])]
        vision = self.images.batch(refs) if refs else {}
        return MMPackedBatch(
            base.input_ids,
            base.position_ids,
            base.loss_mask,
            base.prompt_lengths,
            base.response_lengths,
            attention,
            vision,
        )

    def rope_positions(self, batch: MMPackedBatch) -> torch.Tensor:
        """``[3, B, T]`` mrope positions from the model's own ``get_rope_index`` (images in row order)."""
        return mrope_positions(self.model, batch.input_ids, batch.vision.get("image_grid_thw"), batch.attention_mask)

    def _project(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float() + self._bias  # banned ids: -inf before the log-softmax

    def _token_logprobs(self, model: torch.nn.Module, batch: MMPackedBatch, with_entropy: bool = False):
        """(log-probs ``[B, T-1]`` of the tempered, banned-masked distribution, entropy or None), fp32."""
        ids = batch.input_ids.to(self.device)
        vision = {k: v.to(self.device) for k, v in batch.vision.items()}
        out = model(
            input_ids=ids,
            attention_mask=batch.attention_mask.to(self.device),
            position_ids=self.rope_positions(batch).to(self.device),
            use_cache=False,
            **vision,
        )
        banned = self.banned.to(self.device)[ids]
        banned_target = banned[:, 1:]
        safe = ids.masked_fill(banned, self.pad_id)  # only used as targets; the model saw the real ids
        logprobs, entropy = next_token_logprobs(
            self._project,
            out.logits.transpose(0, 1),
            safe,
            temperature=self.settings.temperature,
            chunk_tokens=self.settings.logprob_chunk_tokens,
            with_entropy=with_entropy,
        )
        logprobs = logprobs.masked_fill(banned_target, 0.0)
        if entropy is not None:
            entropy = entropy.masked_fill(banned_target, 0.0)
        return logprobs, entropy

    # ------------------------------------------------------------------ weights
    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The full policy weights under HF names, in host RAM, on data-parallel rank 0 only: under FSDP2 every
        other rank gets ``{}`` (torch's ``full_state_dict`` with ``cpu_offload``: one full copy, where it is
        written). For checkpoints, conversions and a sync that rank 0 sends alone; a sync in which every rank sends
        to its own engine streams the weights instead (``iter_hf_weights``). Collective under FSDP2: call on
        every rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        with self._offload.on_device(optimizer=False):  # the gathers run on the device's process group
            if self.sharded:
                state = get_model_state_dict(
                    self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
                )
            else:
                state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return state

    def iter_hf_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight under HF names, whole, on EVERY data-parallel rank, one tensor at a time on this rank's
        device and in ``dtype``: the weight sync in which each rank sends to the engine on its own GPU.

        Under FSDP2 each shard is cast, moved to the device (an offloaded shard alone) and all-gathered
        (``DTensor.full_tensor``, a collective), as vLLM's ``ModuleSource`` does, so a rank holds one full tensor
        at a time, never the whole model. The names and their order are those of torch's state-dict API (clean
        FQNs, the keys of ``hf_state_dict``), the same on every rank: every rank must consume the whole stream,
        in order, once per pass."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.tensor import DTensor

        # sharded: the local shards under their FQNs (no gather); one rank: the module's own tensors
        state = (
            get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=False))
            if self.sharded
            else self.model.state_dict()
        )
        for name, value in state.items():
            cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
            tensor = value.detach().to(device=self.device, dtype=cast)  # a DTensor stays sharded: only its shard
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    @torch.no_grad()
    def probe_logits(self, ids: torch.Tensor, images: Sequence[ImageRef] = ()) -> torch.Tensor:
        """fp32 logits ``[1, L, V]`` of the policy on the probe ``ids [1, L]`` (with its images); an offloaded
        policy is brought to the device for this forward only."""
        sample = MMSample(ids[0, :1].tolist(), ids[0, 1:].tolist(), [1] * (ids.shape[1] - 1), images=list(images))
        batch = self._pack([sample])
        was_training = self.model.training
        self.model.eval()
        try:
            with self._offload.on_device(optimizer=False):
                vision = {k: v.to(self.device) for k, v in batch.vision.items()}
                out = self.model(
                    input_ids=batch.input_ids.to(self.device),
                    attention_mask=batch.attention_mask.to(self.device),
                    position_ids=self.rope_positions(batch).to(self.device),
                    use_cache=False,
                    **vision,
                )
                return out.logits.float().cpu()
        finally:
            self.model.train(was_training)

    def probe(self, length: int = 24, seed: int = 0) -> tuple[torch.Tensor, list[ImageRef], list[int]]:
        """The multimodal weight-sync probe: (ids ``[1, L]`` = one fixed image then random allowed text ids, its
        image, the text positions after the image that are compared)."""
        from PIL import Image

        tok = self.processor.tokenizer
        image = canonicalize(
            Image.linear_gradient("L").resize((56, 56)).convert("RGB"), 56 * 56, 56 * 56, "probe image"
        )
        start, pad, end = (tok.convert_tokens_to_ids(t) for t in (VISION_START, IMAGE_PAD, VISION_END))
        allowed = (~self.banned[: len(tok)]).nonzero().flatten()
        g = torch.Generator().manual_seed(seed)
        text = allowed[torch.randint(0, len(allowed), (length,), generator=g)].tolist()
        ids = [start] + [pad] * self.images.tokens(image) + [end] + text
        return torch.tensor([ids]), [image], list(range(len(ids) - length, len(ids)))

    # ------------------------------------------------------------------ offload (collocated GPU runs)
    def offload(self, weights: bool | None = None, optimizer: bool | None = None, grads: bool | None = None) -> None:
        """Move weights (policy + reference) and optimizer state to CPU and free the gradients (defaults:
        ``actor.offload_weight / offload_optimizer / offload_grad``), with FSDP2's own module move
        (``training/fsdp_policy_offload.py``). Training and log-prob calls onload first; a weight sync or a
        checkpoint brings the state for its call only."""
        s = self.settings
        self._offload.offload(
            weights=s.offload_weight if weights is None else weights,
            optimizer=s.offload_optimizer if optimizer is None else optimizer,
            grads=s.offload_grad if grads is None else grads,
        )

    def onload(self) -> None:
        """Undo ``offload`` (no-op when nothing is offloaded)."""
        self._offload.onload()

    @property
    def offloaded(self) -> bool:
        return self._offload.offloaded

    def weights_on_device(self):
        """A context with the weights on the device (one weight sync: its probe and its gathers move them once)."""
        return self._offload.on_device(optimizer=False)

    # ------------------------------------------------------------------ checkpoints (training/fsdp_policy_io.py)
    def save(self, directory: str | Path, iteration: int) -> Path | None:
        """The HF model directory (the export) plus optimizer, schedule and RNG; every DP rank calls it."""
        with self._offload.on_device():
            return fsdp_policy_io.save_fsdp_policy(self, directory, iteration)

    def load(self, directory: str | Path) -> int:
        with self._offload.on_device():  # the optimizer state is loaded next to the parameters
            return fsdp_policy_io.load_fsdp_policy(self, directory)
