"""What stage S8 of scripts/gpu_smoke.py adapts to the installed vLLM, chosen by what that vLLM has (never by its
version string), so the stage runs unchanged on the project's vLLM 0.32 and on vLLM 0.26, the newest release built
for the lent device's torch 2.11 (docs/environment.md, "vLLM on the lent GPU"). These adaptations live in the smoke
script only: rlinf_ext's code is written for 0.32 and is exercised as it is.

vLLM 0.26 differs where the project's GPU route touches it:
- trainer side: no trainer engines (``IPCTrainerWeightTransferEngine``, ``IPCTrainerInitInfo``), so
  ``sync/vllm_transfer.py:trainer_init_info`` / ``vllm_trainer_init`` cannot run; 0.26's static
  ``IPCWeightTransferEngine.trainer_send_weights`` does the data plane and ``Vllm026IpcTrainer`` drives the four
  control calls around it, as 0.32's trainer engine does;
- ``AsyncLLM.finish_weight_update()`` takes no ``weight_version`` and ``AsyncLLM.wake_up`` returns None (0.32:
  whether the engine is fully awake), both of which ``sync/vllm_engine_side.py:VLLMGpuSync`` relies on, and its
  ``CompletionOutput`` has no ``weight_versions`` (0.32's weight-version spans, which
  ``generation/vllm_wire.py:result_of_output`` reads; 0.26 labels nothing, read as None): ``EngineCompat``;
- ``vllm/distributed/weight_transfer/ipc_engine.py`` imports ``ray`` at module level (0.32 does not), and the lent
  device has no Ray: ``ensure_ipc_engine_importable`` puts an empty stand-in package first on the path (every other
  ``ray`` use in vLLM imports ``ray.util`` or calls ``ray.is_initialized`` inside try/except, which then report
  Ray as absent; the IPC route here sends through a callable and never reaches ``ray``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

RAY_STANDIN = '''"""Stand-in written by scripts/smoke_vllm_compat.py: vLLM 0.26's ipc_engine imports ray at module level and this
host has no Ray; nothing here is Ray (vLLM's other ray imports find no ray.util and treat Ray as absent)."""


def __getattr__(name):
    raise AttributeError(f"ray is not installed on this host (smoke stand-in); no attribute {name!r}")
'''


def ensure_ipc_engine_importable(work: Path) -> str:
    """Import vLLM's IPC weight-transfer module, first writing the ``ray`` stand-in under ``work`` and putting it on
    ``sys.path`` and ``PYTHONPATH`` (inherited by vLLM's engine and worker processes) when the module needs a ray
    this host lacks. Returns what was done, for the stage's figures."""
    try:
        importlib.import_module("vllm.distributed.weight_transfer.ipc_engine")
        return "not needed"
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
    root = work / "ray_standin"
    (root / "ray").mkdir(parents=True, exist_ok=True)
    (root / "ray" / "__init__.py").write_text(RAY_STANDIN)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    importlib.invalidate_caches()
    importlib.import_module("vllm.distributed.weight_transfer.ipc_engine")
    return f"ray stand-in at {root} (vLLM's ipc_engine imports ray at module level; no Ray here)"


def has_trainer_engines() -> bool:
    """vLLM's trainer-side IPC engine (0.32) present?"""
    ipc = importlib.import_module("vllm.distributed.weight_transfer.ipc_engine")
    return hasattr(ipc, "IPCTrainerWeightTransferEngine")


class Vllm026IpcTrainer:
    """vLLM 0.26's IPC trainer side, driven as 0.32's ``IPCTrainerWeightTransferEngine`` drives it: INIT once (0.26's
    ``IPCWeightTransferInitInfo`` has no fields; ``packed`` travels in each update instead), then per
    ``send_weights``: START, the static ``trainer_send_weights`` (packed: one reused IPC buffer, one UPDATE per
    chunk through ``client.update_weights``), FINISH. One GPU: 0.26's helper sends this process's handles only."""

    def __init__(self, client: Any, source: Any, buffer_bytes: int):
        self.client, self.source, self.buffer_bytes = client, source, int(buffer_bytes)
        client.init_weight_transfer_engine({})

    def send_weights(self) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerSendWeightsArgs,
            IPCWeightTransferEngine,
        )

        self.client.start_weight_update()
        args = IPCTrainerSendWeightsArgs(
            send_mode=lambda info: self.client.update_weights(asdict(info)),
            packed=True,
            packed_buffer_size_bytes=self.buffer_bytes,
        )
        IPCWeightTransferEngine.trainer_send_weights(iter(self.source), args)
        self.client.finish_weight_update()


def ipc_trainer(client: Any, source: Any, buffer_bytes: int) -> tuple[Any, str]:
    """The trainer side of a one-GPU IPC transfer and how it was made: vLLM's trainer engine through the project's
    ``sync/vllm_transfer.py`` (0.32) or ``Vllm026IpcTrainer``."""
    if has_trainer_engines():
        from rlinf_ext.sync.vllm_transfer import trainer_init_info, vllm_trainer_init
        from rlinf_ext.sync.weight_sync import SyncRoutes

        routes = SyncRoutes("paired", actor_world=1, rollout_dp=1, rollout_tp=1)  # collocated, one GPU
        info = trainer_init_info("ipc", routes, 0, buffer_bytes)
        return vllm_trainer_init(
            info, client=client, source=source
        ), "vLLM's IPC trainer engine (sync/vllm_transfer.py)"
    return Vllm026IpcTrainer(client, source, buffer_bytes), "vLLM 0.26's static trainer_send_weights (smoke shim)"


class EngineCompat:
    """An ``AsyncLLM`` as ``VLLMGpuSync`` calls it (vLLM 0.32's signatures), on any vLLM: ``finish_weight_update``
    gets ``weight_version`` only where it takes one, and ``wake_up`` returns whether the engine is fully awake
    (0.26 returns None; then ``not is_sleeping()``, which 0.26 reports once every memory tag is resident and the
    scheduler resumed). Everything else is the engine's own."""

    def __init__(self, engine: Any):
        self._engine = engine
        self.finish_takes_version = "weight_version" in inspect.signature(engine.finish_weight_update).parameters
        self.adaptations: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, *args: Any, **kwargs: Any):
        async for out in self._engine.generate(*args, **kwargs):
            for completion in out.outputs:
                if not hasattr(completion, "weight_versions"):
                    self.adaptations.add("CompletionOutput without weight_versions (read as unlabelled)")
                    completion.weight_versions = None
            yield out

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        if self.finish_takes_version:
            await self._engine.finish_weight_update(weight_version)
            return
        self.adaptations.add("finish_weight_update() without weight_version")
        await self._engine.finish_weight_update()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        result = await self._engine.wake_up(tags=tags)
        if isinstance(result, bool):
            return result
        self.adaptations.add("wake_up's fully-awake read from is_sleeping()")
        return not await self._engine.is_sleeping()
