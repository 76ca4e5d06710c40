"""Qwen2.5-VL generation on vLLM 0.32: ``VLLMGenerator`` with every image of the context.

Requests: vLLM expands each image's ``<|image_pad|>`` itself (its multimodal processor replaces ONE pad per image
by the image's grid-sized run), so the agent loop's ids, which hold each image's expanded run, are sent with every
``<|vision_start|><|image_pad|>+<|vision_end|>`` run collapsed to one pad, and the images go in order of
appearance as ``multi_modal_data`` (keyed by their sha1 for vLLM's multimodal cache). vLLM's expanded prompt
(``RequestOutput.prompt_token_ids``) is compared with the ids sent: a difference (the engine's grid differs from
the actor's processor) is counted as a re-tokenisation mismatch (``mismatch_rate``); the generated ids are kept.
Banned ids (vision special tokens, padded vocabulary rows, as ``generation/hf_vl.py``) are excluded with vLLM's
``allowed_token_ids`` and the engine returns log-probs of the distribution sampled from
(``logprobs_mode="processed_logprobs"``: the allowed-ids mask and the temperature applied, as HF's VL engine).
Replies go through the text engine's ``result_of_output`` (``generation/turn_end.py``).

Engine on CPU (``VL_CPU_ENGINE_ARGS``): vLLM's own Qwen2.5-VL module (``vllm.model_executor.models.qwen2_vl``, line 43) imports
``smart_resize`` from transformers' torchvision image processor, and PyPI's torchvision builds are CUDA-only, so
on a CPU torch it cannot be imported. vLLM's Transformers modeling backend (``model_impl="transformers"``) runs
transformers' own ``Qwen2_5_VLForConditionalGeneration`` under vLLM's scheduler, KV cache and attention, and
loads the HF processor with ``AutoProcessor``; the stock processor needs a video processor (torchvision), so the
checkpoint carries the image-only processor as custom code (``generation/vl_processor.py`` registers it for
``AutoProcessor``; ``trust_remote_code=True`` lets vLLM load it). On GPUs vLLM's native module serves the model
(``model_impl="auto"``; NOT GPU-verified).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf_ext.generation.sglang_vl import vision_runs
from rlinf_ext.generation.sglang_wire import hf_eos_ids
from rlinf_ext.generation.vllm_engine import VLLMGenerator, start_engine
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions, check_generate_args, result_of_output, to_vllm_params
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams
from rlinf_ext.protocol.images import ImageRef
from rlinf_ext.protocol.vl_tokens import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    banned_token_ids,
    text_vocab_size,
    token_id,
)

MAX_IMAGES_PER_PROMPT = 16  # vLLM's limit_mm_per_prompt; an MMSearch-R1 context holds the question's image + results
# vLLM's Transformers backend (vLLM's own Qwen2.5-VL module needs torchvision) and the processor's custom code
VL_CPU_ENGINE_ARGS = {"model_impl": "transformers", "trust_remote_code": True}
AUTO_MAP_KEY = "auto_map"


# ------------------------------------------------------------------------------------------------ requests (pure)
def collapse_image_runs(ids: Sequence[int], token_ids: tuple[int, int, int]) -> list[int]:
    """``ids`` with each ``<|vision_start|><|image_pad|>+<|vision_end|>`` run reduced to one pad (vLLM expands it)."""
    start, pad, end = token_ids
    out, last = [], 0
    for a, b in vision_runs(ids, start, pad, end):
        out += [int(t) for t in ids[last:a]] + [start, pad, end]
        last = b
    return out + [int(t) for t in ids[last:]]


def mm_request(
    prompt_ids: Sequence[int], images: Sequence[ImageRef], token_ids: tuple[int, int, int]
) -> dict[str, Any]:
    """vLLM's prompt dict of one request: collapsed ids, every image in order of appearance, their sha1s as ids."""
    bad = [type(i).__name__ for i in images if not isinstance(i, ImageRef)]
    if bad:
        raise TypeError(f"images must be protocol.images.ImageRef objects, got {bad}")
    runs = vision_runs(prompt_ids, *token_ids)
    if len(runs) != len(images):
        raise ValueError(
            f"the context holds {len(runs)} image run(s) but {len(images)} image(s) were given; "
            "vLLM needs every image of the context, in order of appearance"
        )
    request: dict[str, Any] = {"prompt_token_ids": collapse_image_runs(prompt_ids, token_ids)}
    if images:
        request["multi_modal_data"] = {"image": [img.to_pil() for img in images]}
        request["multi_modal_uuids"] = {"image": [img.sha1 for img in images]}
    return request


def allowed_token_ids(vocab_size: int, banned: Sequence[int]) -> list[int] | None:
    """The complement of ``banned`` in ``[0, vocab_size)`` (vLLM's whitelist); None when nothing is banned."""
    if not banned:
        return None
    banned_set = set(int(b) for b in banned)
    return [i for i in range(int(vocab_size)) if i not in banned_set]


def vl_engine_options(
    options: VLLMEngineOptions, *, cuda: bool, max_images: int = MAX_IMAGES_PER_PROMPT
) -> VLLMEngineOptions:
    """``options`` for a Qwen2.5-VL checkpoint: image limit, processed log-probs, and on CPU the Transformers
    backend with the processor's custom code (pure)."""
    extra = dict(options.extra)
    extra.setdefault("limit_mm_per_prompt", {"image": int(max_images)})
    extra.setdefault("logprobs_mode", "processed_logprobs")
    if not cuda:
        for key, value in VL_CPU_ENGINE_ARGS.items():
            extra.setdefault(key, value)
    options.extra = extra
    return options


def check_processor_dir(model_path: str | Path) -> None:
    """Refuse a checkpoint whose processor vLLM cannot load without torchvision (no ``auto_map`` to the
    image-only processor) with the fix named."""
    config = Path(model_path) / "processor_config.json"
    found = json.loads(config.read_text()) if config.is_file() else {}
    if "AutoProcessor" not in found.get(AUTO_MAP_KEY, {}):
        raise ValueError(
            f"{model_path}: its processor_config.json has no auto_map to rlinf_ext's image-only Qwen2.5-VL processor, "
            "and vLLM on a CPU torch (no torchvision) cannot load the stock one. Save the processor again with "
            "generation.vl_processor.load_image_only_processor(DIR).save_pretrained(DIR) (the tiny assets do: "
            "re-run `rlinf-ext make-tiny-assets --with-mm`)."
        )


# module prefix -> checkpoint prefix: the inverse of transformers 5's Qwen2.5-VL conversion mapping
# (``visual`` -> ``model.visual``, ``model`` -> ``model.language_model``), whose lookahead patterns do not reverse
_CHECKPOINT_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))


def checkpoint_name(module_name: str) -> str:
    """A Qwen2.5-VL module parameter name (what the actor's ``state_dict`` holds) -> the checkpoint name vLLM's
    loader maps (pure): the Transformers backend's ``load_weights`` takes the on-disk layout."""
    for module_prefix, checkpoint_prefix in _CHECKPOINT_PREFIXES:
        if module_name.startswith(module_prefix):
            return checkpoint_prefix + module_name[len(module_prefix) :]
    return module_name


def engine_mismatch(sent_ids: Sequence[int], engine_prompt_ids: Sequence[int] | None) -> bool:
    """True when vLLM's expanded prompt differs from the ids the agent loop holds."""
    return engine_prompt_ids is not None and [int(t) for t in engine_prompt_ids] != [int(t) for t in sent_ids]


# ------------------------------------------------------------------------------------------------ generator
class VLLMVLGenerator(VLLMGenerator):
    """``await gen.generate(prompt_ids, params, images=[ImageRef, ...], seed=...)``: ``images`` are every image of
    the context in order, ``prompt_ids`` hold each image's expanded pad run (as the actor's processor makes it)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        eos_ids,
        *,
        vocab_size: int,
        banned_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ):
        """``banned_ids=None``: the vision special ids and the padded vocabulary rows (``vl_tokens.banned_token_ids``)."""
        super().__init__(engine, tokenizer, eos_ids, **kwargs)
        self.token_ids = tuple(token_id(tokenizer, t) for t in (VISION_START, IMAGE_PAD, VISION_END))
        self.banned_ids = banned_token_ids(tokenizer, vocab_size) if banned_ids is None else sorted(banned_ids)
        self.allowed_ids = allowed_token_ids(len(tokenizer), self.banned_ids)
        self.prompts_checked = 0
        self.prompt_mismatches = 0

    @classmethod
    def start(
        cls,
        options: VLLMEngineOptions,
        *,
        return_logprobs: bool = False,
        seed: int | None = None,
        cuda: bool | None = None,
        banned_ids: Sequence[int] | None = None,
    ) -> "VLLMVLGenerator":
        from transformers import AutoTokenizer

        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        options = vl_engine_options(options, cuda=cuda)
        if options.extra.get("trust_remote_code"):
            check_processor_dir(options.model_path)
        tokenizer = AutoTokenizer.from_pretrained(str(options.tokenizer_path or options.model_path))
        vocab = text_vocab_size(json.loads((Path(options.model_path) / "config.json").read_text()))
        t0 = time.perf_counter()
        engine = start_engine(options)
        gen = cls(
            engine,
            tokenizer,
            hf_eos_ids(str(options.model_path), tokenizer),
            vocab_size=vocab,
            banned_ids=banned_ids,
            return_logprobs=return_logprobs,
            seed=seed,
            in_process=options.in_process,
        )
        gen.start_s = time.perf_counter() - t0
        gen.options = options
        return gen

    @classmethod
    def from_config(cls, cfg: Any, rank: int = 0, **kwargs: Any) -> "VLLMVLGenerator":
        """Seeded with ``runner.seed`` unless ``seed=`` is given (per-request seeds: reproducible sampling)."""
        return super().from_config(cfg, rank, **{"seed": int(cfg.runner.seed), **kwargs})

    @property
    def mismatch_rate(self) -> float:
        """Share of prompts whose engine-side expansion differed from the agent loop's ids (0.0 before any)."""
        return self.prompt_mismatches / self.prompts_checked if self.prompts_checked else 0.0

    @property
    def mismatch_counts(self) -> tuple[int, int]:
        """(mismatches, prompts checked) since the engine started; the runner takes differences per step."""
        return self.prompt_mismatches, self.prompts_checked

    def _params(self, sampling_params: SamplingParams, seed: int | None, **overrides: Any) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        kwargs = to_vllm_params(sampling_params, self.eos_ids, seed=seed, return_logprobs=self.return_logprobs)
        if self.allowed_ids is not None:
            kwargs["allowed_token_ids"] = self.allowed_ids
        kwargs.update(overrides)
        return VSamplingParams(**kwargs, output_kind=RequestOutputKind.FINAL_ONLY)

    async def _final(self, request: dict[str, Any], params: Any, prefix: str, priority: int = 0) -> Any:
        final = None
        async for out in self.engine.generate(request, params, f"{prefix}-{next(self._ids)}", priority=int(priority)):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a generate request")
        return final

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        images: list[Any] | None = None,
        *,
        seed: int | None = None,
        priority: int = 0,
    ) -> GenerationResult:
        check_generate_args(prompt_ids, sampling_params)
        request = mm_request(prompt_ids, list(images or []), self.token_ids)
        call = next(self._calls)
        if seed is None and self._seed is not None:
            seed = self._seed + call
        final = await self._final(request, self._params(sampling_params, seed), "rlinf-vl", priority)
        self.prompts_checked += 1
        self.prompt_mismatches += int(engine_mismatch(prompt_ids, final.prompt_token_ids))
        return result_of_output(final.outputs[0], self.decode, sampling_params, self.eos_ids, self.return_logprobs)

    async def load_weight_bucket(self, named) -> None:
        """One bucket of ``(module name, tensor)`` pairs, renamed to the checkpoint layout vLLM loads."""
        await super().load_weight_bucket((checkpoint_name(n), t) for n, t in named)

    async def prompt_logprobs(
        self, ids: list[int], images: list[Any] | None = None
    ) -> list[tuple[float | None, int, None]]:
        """The post-sync probe with its images: vLLM's log-prob of every prompt token given the ones before (raw
        distribution, no banned ids), as ``VLLMGenerator.prompt_logprobs``. The ids are vLLM's expanded prompt,
        which must equal ``ids``."""
        request = mm_request(ids, list(images or []), self.token_ids)
        params = self._params(
            SamplingParams(max_new_tokens=1, do_sample=False),
            None,
            prompt_logprobs=0,
            detokenize=False,
            allowed_token_ids=None,
            logprobs=None,
        )
        final = await self._final(request, params, "rlinf-vl-probe")
        if engine_mismatch(ids, final.prompt_token_ids):
            raise ValueError(
                "vLLM expanded the probe's images differently from the actor's processor; the probe "
                "positions would not line up"
            )
        entries: list[tuple[float | None, int, None]] = [(None, int(ids[0]), None)]
        for tok, step in zip(ids[1:], final.prompt_logprobs[1:]):
            entries.append((float(step[int(tok)].logprob), int(tok), None))
        return entries


__all__ = [
    "VLLMVLGenerator",
    "VL_CPU_ENGINE_ARGS",
    "allowed_token_ids",
    "check_processor_dir",
    "checkpoint_name",
    "collapse_image_runs",
    "engine_mismatch",
    "mm_request",
    "vl_engine_options",
]
