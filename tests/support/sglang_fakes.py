"""Recording stand-ins of sglang 0.5.23's ``Engine`` and its ``TokenizerManager`` (what needs a GPU), for the real
``SGLangControl`` (``workers/rollout_sglang.py``) and ``SGLangEngineGenerator`` to call on CPU.

Every call is checked against sglang's own signature, read from its installed source (``tests/support/sglang_source.py``):
an unknown or missing argument raises sglang's ``TypeError``, a request struct of the wrong type is refused, and
``async_generate``'s ``sampling_params`` must build sglang's ``SamplingParams`` (the ``TokenizerManager`` calls
``SamplingParams(**sampling_params)``). Replies take the shapes sglang's methods return: ``(success, message)``
for the weight calls, a ``FlushCacheReqOutput`` for ``flush_cache``.

``calls`` records each call compactly for the tests' order checks; subclasses give behaviour with ``on_<method>``.
"""

from __future__ import annotations

import io
from multiprocessing.reduction import ForkingPickler
from typing import Any

from tests.support.sglang_source import SGLangSource, check_call
from tests.support.signature_checks import bind_like

ENGINE = "sglang.srt.entrypoints.engine"
MANAGER = "sglang.srt.managers.tokenizer_manager"
SAMPLING = "sglang.srt.sampling.sampling_params"
UTILS = "sglang.srt.utils"


def forking_serialize(obj: Any) -> bytes:
    """What sglang's ``MultiprocessingSerializer.serialize(obj)`` returns (its body: a ``ForkingPickler`` dump)."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


class SourceSerializer:
    """``MultiprocessingSerializer`` with ``serialize`` checked against sglang's."""

    def __init__(self, source: SGLangSource):
        self.source = source

    def serialize(self, *args: Any, **kwargs: Any) -> bytes:
        bound = check_call(self.source, UTILS, "MultiprocessingSerializer.serialize", *args, **kwargs)
        if bound.arguments["output_str"]:
            raise AssertionError("the rollout sends raw bytes (output_str=False)")
        return forking_serialize(bound.arguments["obj"])


def check_generate(source: SGLangSource, engine: Any, *args: Any, **kwargs: Any) -> dict:
    """An ``Engine.async_generate`` call bound to sglang's signature (defaults applied), its ``sampling_params``
    to sglang's ``SamplingParams``; the bound arguments."""
    bound = check_call(source, ENGINE, "Engine.async_generate", engine, *args, **kwargs)
    params = bound.arguments["sampling_params"]
    if params is not None:
        bind_like(source.struct_signature(SAMPLING, "SamplingParams"), label="sglang's SamplingParams", **params)
    return bound.arguments


class RecordingTokenizerManager:
    """The ``TokenizerManager`` control methods ``SGLangControl`` calls."""

    def __init__(self, source: SGLangSource):
        self.source, self.io = source, source.io_struct
        self.calls: list = []

    async def _control(self, method: str, log: Any, *args: Any, **kwargs: Any) -> Any:
        bound = check_call(self.source, MANAGER, f"TokenizerManager.{method}", self, *args, **kwargs)
        obj = bound.arguments.get("obj")
        self.calls.append(log(obj) if callable(log) else log)
        handler = getattr(self, f"on_{method}", None)
        if handler is not None:
            return await handler(obj)
        returns = str(self.source.signature(MANAGER, f"TokenizerManager.{method}").return_annotation)
        if returns == "Tuple[bool, str]":
            return True, ""
        if returns == "FlushCacheReqOutput":
            return self.io.FlushCacheReqOutput(success=True)
        return None

    async def release_memory_occupation(self, *args, **kwargs):
        return await self._control("release_memory_occupation", lambda o: ("release", o.tags), *args, **kwargs)

    async def resume_memory_occupation(self, *args, **kwargs):
        return await self._control("resume_memory_occupation", lambda o: ("resume", tuple(o.tags)), *args, **kwargs)

    async def begin_weight_update(self, *args, **kwargs):
        return await self._control("begin_weight_update", "begin", *args, **kwargs)

    async def update_weights_from_tensor(self, *args, **kwargs):
        return await self._control(
            "update_weights_from_tensor", lambda o: ("update", len(o.serialized_named_tensors)), *args, **kwargs
        )

    async def init_weights_update_group(self, *args, **kwargs):
        return await self._control(
            "init_weights_update_group", lambda o: ("init_group", o.rank_offset, o.world_size), *args, **kwargs
        )

    async def update_weights_from_distributed(self, *args, **kwargs):
        return await self._control(
            "update_weights_from_distributed", lambda o: ("update", tuple(o.names)), *args, **kwargs
        )

    async def end_weight_update(self, *args, **kwargs):
        return await self._control("end_weight_update", "end", *args, **kwargs)

    async def flush_cache(self, *args, **kwargs):
        return await self._control("flush_cache", "flush", *args, **kwargs)


class RecordingEngine:
    """sglang's ``Engine``: ``async_generate`` and ``shutdown`` checked; ``reply(arguments)`` (a subclass's)
    answers a generate call with the bound arguments (defaults applied)."""

    def __init__(self, source: SGLangSource, manager: RecordingTokenizerManager | None = None):
        self.source = source
        self.tokenizer_manager = manager if manager is not None else RecordingTokenizerManager(source)
        self.shutdowns = 0

    async def async_generate(self, *args: Any, **kwargs: Any) -> dict:
        return await self.reply(check_generate(self.source, self, *args, **kwargs))

    async def reply(self, arguments: dict) -> dict:
        raise NotImplementedError

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        check_call(self.source, ENGINE, "Engine.shutdown", self, *args, **kwargs)
        self.shutdowns += 1
