"""A CPU ``Generator`` (``protocol/generation.py``) on `transformers` `generate` with engine-side stop strings.

Concurrent `generate` calls (one per trajectory) are queued and served in batches: requests with the same
sampling settings are left-padded into one `model.generate` call, run in a worker thread so the event loop
keeps serving search calls meanwhile. The queue serves the lowest ``priority`` first (the dispatch index of the
request's batch: with batches rolled out ahead, the one the next step waits for), arrival order among equals
(``pick_batch``). Each row is then cut at its own end (``generation/turn_end.py``: the
first EOS, the first token that completes a stop string, or its own `max_new_tokens`; rows that finished early
are padded by HF, and those pad ids are never returned). The ids returned are exactly the sampled ones; nothing is re-encoded.

Partial rollout (``interruptible``, ``runner.partial_rollout``): a weight sync no longer waits for a whole turn. The
rollout worker sets ``sync_pending``; a stopping criterion then ends the running ``generate`` after its current
decode step, and each turn cut short goes on, once the sync is done, from its prompt and its tokens so far on the
new weights (``generate(..., turn=...)``: ``turn`` admits each segment and gives the weight version that samples it).
The segments are joined: the ids and the log-probs as each segment sampled them (the prefix is never scored again
by the new weights), one weight version per token, and the end of the turn found on the joined ids (a stop string
may straddle the cut).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from rlinf_ext.generation.turn_end import turn_end
from rlinf_ext.models.dtypes import dtype_of_hf_name
from rlinf_ext.protocol.generation import (
    GenerationResult,
    SamplingParams,
    token_versions,
)

# admits one segment of a turn and gives the weight version that samples it (the rollout worker's WeightGate.turn)
Turn = Callable[[], AbstractAsyncContextManager[int]]


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    images: list[Any] | None = None  # vision-language engines only (generation/hf_vl.py)
    priority: int = 0  # lower is served first: the dispatch index of its batch


def pick_batch(pending: list[_Request], max_batch_size: int) -> list[_Request]:
    """The requests the next ``model.generate`` serves (pure): the first in queue order (lowest ``priority``, then
    arrival; ``pending`` is in arrival order) and the requests batchable with it, in that order, up to
    ``max_batch_size``. A later batch's request can join the call ahead of an older one only when the older one's
    sampling settings differ from the head's (they cannot share a ``model.generate``)."""
    queued = sorted(pending, key=lambda r: r.priority)  # stable: arrival order among equal priorities
    key = _batch_key(queued[0].params)
    return [r for r in queued if _batch_key(r.params) == key][:max_batch_size]


def _batch_key(params: SamplingParams) -> tuple:
    """Requests are batched together only when everything but the token budget agrees."""
    return (
        params.do_sample,
        params.temperature,
        params.top_p,
        params.top_k,
        tuple(params.stop),
        params.repetition_penalty,
        params.include_stop_str_in_output,
    )


class SyncPending(StoppingCriteria):
    """Ends every row of a ``generate`` once ``event`` is set (a weight sync waits: partial rollout); HF checks it
    after each decode step, so the rows keep every token sampled so far."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def cut_by_sync(result: GenerationResult, max_new_tokens: int) -> bool:
    """A segment the sync cut short: it ended on neither EOS nor a stop string, before its own budget (pure)."""
    return result.finish_reason == "length" and len(result.output_ids) < max_new_tokens


def eos_token_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """The ids that end a turn: the generation config's ``eos_token_id`` (one or a list) plus the tokenizer's."""
    ids: set[int] = set()
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an EOS token id")
    return ids


class HFGenerator:
    """`await gen.generate(prompt_ids, SamplingParams) -> GenerationResult`, safe from many coroutines."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 16,
        return_logprobs: bool = False,
        seed: int | None = None,
        logits_processors: list[Any] | None = None,
    ):
        """`logits_processors`: optional HF `LogitsProcessor`s applied to every call (constrained decoding,
        scripted dry runs); they change what is sampled, never what is returned."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = int(max_batch_size)
        self.return_logprobs = return_logprobs
        self.eos_ids = eos_token_ids(getattr(model, "generation_config", None), tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.pad_id = int(pad)
        self._seed = seed
        self.logits_processors = list(logits_processors or [])
        self._calls = 0
        self._model_lock = threading.Lock()  # one forward at a time, also across threads / event loops
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # observed batch sizes (for benchmarks and tests)
        self.interruptible = False  # partial rollout: a set sync_pending ends the running generate (module docstring)
        self.sync_pending = threading.Event()

    @classmethod
    def from_pretrained(
        cls, model_path: str | Path, tokenizer_path: str | Path | None = None, dtype: str = "float32", **kwargs: Any
    ) -> "HFGenerator":
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype_of_hf_name(dtype, "rollout.hf.dtype"))
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def from_config(cls, cfg: Any) -> "HFGenerator":
        """The CPU engine of an experiment config (``rollout.hf``), seeded with ``runner.seed``."""
        hf = cfg.rollout.hf
        return cls.from_pretrained(
            str(cfg.rollout.model.model_path),
            dtype=hf.dtype,
            max_batch_size=int(hf.max_batch_size),
            seed=int(cfg.runner.seed),
        )

    def reseed(self, seed: int | None) -> None:
        """Restart the per-call seed sequence (call k uses seed + k), for reproducible sampling."""
        self._seed, self._calls = seed, 0

    # ---- weights (the training side calls these after each actor step) ----
    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        with self._model_lock:
            self.model.load_state_dict(state_dict, strict=strict)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, tensor) pairs into the model in place; unknown names are an error."""
        params = dict(self.model.named_parameters())
        with self._model_lock, torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise KeyError(f"update_weights: the rollout model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].dtype))

    # ---- generation ----
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        images: list[Any] | None = None,
        *,
        turn: Turn | None = None,
        priority: int = 0,
    ) -> GenerationResult:
        """``turn`` (interruptible engines): admits each segment of the turn and gives its weight version; the
        result then carries one version per token when a sync cut the turn (the module docstring). ``priority``:
        the queue serves lower first (``pick_batch``)."""
        if not prompt_ids:
            raise ValueError("generate needs a non-empty prompt")
        if sampling_params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling_params.max_new_tokens}")
        self._check_images(images)
        if turn is None:
            return await self._submit(prompt_ids, sampling_params, images, priority)
        segments: list[tuple[GenerationResult, int]] = []
        sampled: list[int] = []
        while True:
            params = sampling_params.with_updates(max_new_tokens=sampling_params.max_new_tokens - len(sampled))
            async with turn() as version:
                segment = await self._submit(list(prompt_ids) + sampled, params, images, priority)
            segments.append((segment, version))
            sampled += segment.output_ids
            if not (self.interruptible and cut_by_sync(segment, params.max_new_tokens)):
                return self.join_segments(segments, sampling_params)

    def join_segments(self, segments: list[tuple[GenerationResult, int]], params: SamplingParams) -> GenerationResult:
        """One turn from its ``(segment, weight version)`` pieces: the ids and log-probs as sampled, a version per
        token (one int when a single version sampled them all), the end found again on the joined ids."""
        ids = [t for seg, _ in segments for t in seg.output_ids]
        versions = [v for seg, version in segments for v in token_versions(version, len(seg.output_ids))]
        logprobs = None  # a segment cut before its first token (queued at the sync) brings no log-probs, and lacks none
        if all(seg.logprobs is not None or not seg.output_ids for seg, _ in segments):
            logprobs = [lp for seg, _ in segments for lp in (seg.logprobs or [])]
        end = turn_end(
            ids,
            self.decode,
            eos_ids=self.eos_ids,
            stop=params.stop,
            max_new_tokens=params.max_new_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        kept = len(end.output_ids)
        versions = versions[:kept]
        return GenerationResult(
            output_ids=end.output_ids,
            text=end.text,
            finish_reason=end.finish_reason,
            matched_stop=end.matched_stop,
            logprobs=None if logprobs is None else logprobs[:kept],
            weight_version=versions[0] if len(set(versions)) == 1 else versions,
        )

    async def _submit(
        self, prompt_ids: list[int], sampling_params: SamplingParams, images: list[Any] | None, priority: int = 0
    ) -> GenerationResult:
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling_params, loop.create_future(), list(images or []), priority)
        self._pending.append(request)
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let coroutines scheduled in the same tick join this batch
            if self.interruptible and self.sync_pending.is_set():  # admitted before the sync: cut before a token
                for request in self._pending:
                    if not request.future.done():
                        request.future.set_result(GenerationResult(output_ids=[], text="", finish_reason="length"))
                self._pending = []
                break
            batch = pick_batch(self._pending, self.max_batch_size)
            self._pending = [r for r in self._pending if not any(r is b for b in batch)]
            try:
                results = await asyncio.to_thread(self._run_batch, batch)
            except Exception as exc:  # hand the error to every waiting caller instead of losing it
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request, result in zip(batch, results):
                if not request.future.done():
                    request.future.set_result(result)

    def _check_images(self, images: list[Any] | None) -> None:
        if images:
            raise ValueError(
                "this text engine got images; a vision-language model needs generation.hf_vl.HFVLGenerator"
            )

    def _run_batch(self, batch: list[_Request]) -> list[GenerationResult]:
        return self._generate_batch([r.prompt_ids for r in batch], [r.params for r in batch])

    def generate_batch_sync(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Blocking batch generation (no event loop needed)."""
        return self._generate_batch(prompts, [params] * len(prompts))

    def _model_inputs(self, input_ids: torch.Tensor, extra_inputs: dict[str, Any] | None) -> dict[str, Any]:
        """What `generate` gets beside the left-padded ids and their mask (the VL generator adds modality ids)."""
        return dict(extra_inputs or {})

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params_list: list[SamplingParams],
        extra_inputs: dict[str, Any] | None = None,
        banned_ids: list[int] | None = None,
    ) -> list[GenerationResult]:
        """One left-padded `model.generate`; `extra_inputs` (e.g. pixel values) go to the model as they are and
        `banned_ids` are never sampled and get log-prob -inf (the distribution actually sampled from)."""
        params = params_list[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: new tokens line up at column `width`
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        kwargs = self._generate_kwargs(params, max(p.max_new_tokens for p in params_list), banned_ids)
        with self._model_lock, torch.no_grad():
            if self._seed is not None:
                torch.manual_seed(self._seed + self._calls)
            self._calls += 1
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention, **self._model_inputs(input_ids, extra_inputs), **kwargs
            )
        self.batch_sizes.append(len(prompts))
        new_tokens = out.sequences[:, width:].tolist()
        logprobs = None
        if self.return_logprobs:
            logits = torch.stack(out.logits, dim=1).float()  # [B, T, V]
            if params.do_sample and params.temperature > 0:
                logits = logits / params.temperature
            if banned_ids:
                logits[..., banned_ids] = float("-inf")
            chosen = out.sequences[:, width:].unsqueeze(-1)
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist()
        return [
            self._result(new_tokens[row], p, None if logprobs is None else logprobs[row])
            for row, p in enumerate(params_list)
        ]

    def _result(self, ids: list[int], params: SamplingParams, logprobs: list[float] | None) -> GenerationResult:
        """One row cut at its own end (``turn_end``: HF pads rows that ended early, the budget is the batch's)."""
        end = turn_end(
            ids,
            self.decode,
            eos_ids=self.eos_ids,
            stop=params.stop,
            max_new_tokens=params.max_new_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        kept = len(end.output_ids)
        return GenerationResult(
            output_ids=end.output_ids,
            text=end.text,
            finish_reason=end.finish_reason,
            matched_stop=end.matched_stop,
            logprobs=None if logprobs is None else logprobs[:kept],
        )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _generate_kwargs(
        self, params: SamplingParams, max_new_tokens: int, banned_ids: list[int] | None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            do_sample=params.do_sample,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=self.return_logprobs,
            repetition_penalty=params.repetition_penalty,
        )
        if params.do_sample:
            kwargs.update(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k and params.top_k > 0 else 0,
            )
        else:  # greedy: sampling flags are not passed (HF warns "only used in sample-based generation modes")
            kwargs.update(self._unset_model_sampling_flags())
        if banned_ids:
            kwargs["suppress_tokens"] = list(banned_ids)
        if self.logits_processors:
            kwargs["logits_processor"] = LogitsProcessorList(self.logits_processors)
        if self.interruptible:
            kwargs["stopping_criteria"] = StoppingCriteriaList([SyncPending(self.sync_pending)])
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        return kwargs

    def _unset_model_sampling_flags(self) -> dict[str, None]:
        """``None`` for each sampling flag the model's own generation_config sets to a non-neutral value
        (e.g. Qwen2.5 ships temperature 0.7, top_p 0.8, top_k 20): greedy decoding ignores them, and leaving
        them set would make HF warn on every call. Neutral or absent flags are simply not passed."""
        config = getattr(self.model, "generation_config", None)
        neutral = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}  # HF's defaults: no warning when greedy
        out: dict[str, None] = {}
        for flag, value in neutral.items():
            current = getattr(config, flag, None)
            if current is not None and current != value:
                out[flag] = None
        return out
