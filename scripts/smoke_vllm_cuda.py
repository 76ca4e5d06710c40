"""The CUDA-only parts of stage S8 (scripts/smoke_stages_vllm.py): vLLM's sleep levels measured against
``models/memory.py``'s engine terms, and the collocated IPC route fed from a second process on the same GPU.

Memory is read device-wide (``torch.cuda.mem_get_info``, nvidia-smi's free figure; NVML's beside it where present)
after this process's own cache is emptied, so what moves is the engine's. This process holds its CUDA context and
the fp32 reference model throughout, and the producer process touches CUDA only for the IPC route, after every
sleep measurement. Host RAM is the system's available memory (pinned backups included) and the resident set of
the engine's processes.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from smoke_common import GIB, Context, Record
from smoke_vllm_model import (
    CUDA_BUCKET_BYTES,
    CUDA_FRACTION,
    MEMORY_TOL,
    WEIGHTS_REL_TOL,
    SmokeModel,
    changed_state,
    check_probe,
    load_reference,
    reference_logits,
    reference_model,
)

PRODUCER_TIMEOUT_S = 120
IPC_SEED = 2


def _gib(n: float) -> str:
    return f"{n / GIB:.3f} GiB"


def _nvml_free() -> int | None:
    """Free bytes of GPU 0 as NVML (nvidia-smi) reports them, without a CUDA context; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
    except Exception:  # noqa: BLE001 - no NVML here: the torch figures stand alone
        return None


@dataclass(frozen=True)
class Reading:
    free: int  # device-wide free bytes (torch.cuda.mem_get_info)
    host_available: int  # the system's available RAM
    engine_rss: int  # resident set of the engine's processes (this process's children but the producer)
    nvml_free: int | None


# ------------------------------------------------------------------------------------------ the producer process
class QueueClient:
    """vLLM's ``VLLMWeightSyncClient`` (structural) over two queues to the stage process, which answers each call with
    ``VLLMGpuSync.handle``: the part ``sync/vllm_transfer.py:RolloutEngineClient`` plays over RLinf. Each call returns
    once the engine has answered (the packed producer reuses its buffer only then)."""

    def __init__(self, outbox, inbox):
        self.outbox, self.inbox = outbox, inbox

    def _call(self, method: str, payload) -> None:
        self.outbox.put(("call", (method, payload)))
        kind, error = self.inbox.get(timeout=PRODUCER_TIMEOUT_S)
        if kind != "ok":
            raise RuntimeError(f"the engine refused {method}: {error}")

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        from rlinf_ext.sync.vllm_transfer import INIT

        self._call(INIT, dict(init_info))

    def start_weight_update(self) -> None:
        from rlinf_ext.sync.vllm_transfer import START

        self._call(START, None)

    def update_weights(self, update_info) -> None:
        from rlinf_ext.sync.vllm_transfer import UPDATE

        self._call(UPDATE, update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        from rlinf_ext.sync.vllm_transfer import FINISH

        self._call(FINISH, weight_version)


def ipc_producer(work: str, inbox, outbox) -> None:
    """The actor's side, in a process of its own: import vLLM (then "ready"; no CUDA yet), then on ("go", (model,
    probe)) take the changed weights (``changed_state``, seed ``IPC_SEED``) to the GPU, compute the probe's logits
    with them (the sync header's probe), and send them through vLLM's IPC trainer side
    (``smoke_vllm_compat.ipc_trainer``)."""
    try:
        import torch
        import vllm.distributed.weight_transfer.ipc_engine  # noqa: F401  (the slow import, while the engine starts)
        from smoke_vllm_compat import ipc_trainer

        from rlinf_ext.sync.vllm_transfer import HFWeightSource, ipc_buffer_bytes
        from rlinf_ext.sync.weight_sync import release_cuda_cache

        outbox.put(("ready", torch.cuda.is_initialized()))
        kind, detail = inbox.get(timeout=900)
        if kind != "go":
            return
        model, probe = detail
        torch.cuda.set_device(0)
        state = changed_state(model, IPC_SEED)
        ref = reference_model(model, Context("cuda", Path(work)))
        load_reference(ref, state)
        logits = reference_logits(ref, probe)
        del ref
        torch.cuda.empty_cache()
        tensors = {k: v.to("cuda") for k, v in state.items()}
        source = HFWeightSource(lambda: iter(tensors.items()))
        buffer = ipc_buffer_bytes(source.metadata(), CUDA_BUCKET_BYTES)
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        trainer, how = ipc_trainer(QueueClient(outbox, inbox), source, buffer)
        trainer.send_weights()
        seconds = time.perf_counter() - t
        peak = torch.cuda.max_memory_reserved()
        tensors.clear()  # the producer's copies go; the engine holds its own
        del trainer, source
        release_cuda_cache()
        # by value (numpy): a CPU tensor would travel as a handle into this process's memory, which ends now
        outbox.put(
            (
                "done",
                (
                    logits.numpy(),
                    {"trainer side": how, "seconds": seconds, "buffer bytes": buffer, "peak reserved": peak},
                ),
            )
        )
    except BaseException:
        outbox.put(("failed", traceback.format_exc()))
        raise


# ------------------------------------------------------------------------------------------ the stage's CUDA side
class CudaSide:
    """Made before this process touches CUDA: reads the bare context's cost, then starts the producer (its vLLM
    import overlaps the model's build here; it touches CUDA only when told to send)."""

    def __init__(self, ctx: Context):
        import torch
        import torch.multiprocessing as mp
        from smoke_vllm_compat import ensure_ipc_engine_importable

        self.ctx = ctx
        self.standin = ensure_ipc_engine_importable(ctx.work)  # before the producer and the engine start
        pre = None if torch.cuda.is_initialized() else _nvml_free()  # (vLLM's import leaves CUDA alone)
        self.total = torch.cuda.mem_get_info()[1]
        self.context = None if pre is None else pre - torch.cuda.mem_get_info()[0]
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference forward in true fp32
        spawn = mp.get_context("spawn")
        self.to_producer, self.from_producer = spawn.Queue(), spawn.Queue()
        self.producer = spawn.Process(target=ipc_producer, args=(str(ctx.work), self.to_producer, self.from_producer))
        self.producer.start()

    def read(self) -> Reading:
        import psutil
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rss = 0
        for child in psutil.Process().children(recursive=True):
            if self.producer is not None and child.pid == self.producer.pid:
                continue
            try:
                rss += child.memory_info().rss
            except psutil.Error:
                pass
        return Reading(torch.cuda.mem_get_info()[0], psutil.virtual_memory().available, rss, _nvml_free())

    def before_engine(self, rec: Record) -> None:
        """The baseline: the reference model loaded here, the producer's imports done (without CUDA)."""
        import torch

        kind, detail = self.from_producer.get(timeout=PRODUCER_TIMEOUT_S)
        if kind != "ready":
            raise RuntimeError(f"the producer process failed while importing:\n{detail}")
        if detail:
            raise RuntimeError(
                "the producer process initialised CUDA while importing vLLM: the memory baseline "
                "would move under the measurements"
            )
        self.base = self.read()
        rec.figure("ray for vLLM's ipc_engine", self.standin)
        from rlinf_ext.models.memory import VLLM_CUDA_CONTEXT_BYTES

        if self.context is None:
            rec.figure("CUDA context of this process", "not measured (no NVML, or CUDA was initialised by an import)")
        else:
            rec.figure(
                "CUDA context of this process (NVML free before - after torch's CUDA init)",
                f"{_gib(self.context)} measured vs {_gib(VLLM_CUDA_CONTEXT_BYTES)} planned per vLLM worker",
            )
            rec.check(
                "a CUDA context <= the plan's VLLM_CUDA_CONTEXT_BYTES (+256 MiB)",
                self.context <= VLLM_CUDA_CONTEXT_BYTES + MEMORY_TOL,
            )
        rec.figure(
            "GPU",
            f"{torch.cuda.get_device_name(0)}, {_gib(self.total)} total, {_gib(self.base.free)} free before the engine",
        )

    def plan(self, model: SmokeModel, level: int):
        from rlinf_ext.models.memory import ModelShape, engine_memory

        s = model.shape
        shape = ModelShape(
            s.num_hidden_layers,
            s.hidden_size,
            s.intermediate_size,
            s.num_attention_heads,
            s.num_key_value_heads,
            s.hidden_size // s.num_attention_heads,
            model.vocab_rows,
            s.tie_word_embeddings,
        )
        return engine_memory(
            shape,
            gpu_bytes=self.total,
            fraction=CUDA_FRACTION,
            dtype_bytes=2,
            tensor_parallel=1,
            backend="vllm",
            sleep_level=level,
            bucket_bytes=CUDA_BUCKET_BYTES,
        )

    async def check_sleep(self, rec: Record, gen, model: SmokeModel, prompt: list[int]) -> None:
        """Level 1, wake_up; level 2, wake_up(weights), wake_up(kv_cache); measured against the plan. The weights
        are garbage after the level-2 wake-up: the caller reloads them next."""
        from rlinf_ext.protocol.generation import SamplingParams

        engine, base, tol = gen.engine, self.base, MEMORY_TOL
        plan1, plan2 = self.plan(model, 1), self.plan(model, 2)
        greedy = SamplingParams(max_new_tokens=16, do_sample=False, stop=[])
        before = (await gen.generate(prompt, greedy)).output_ids
        awake = self.read()
        t = time.perf_counter()
        await engine.sleep(level=1, mode="wait")
        s1_seconds, s1 = time.perf_counter() - t, self.read()
        t = time.perf_counter()
        await engine.wake_up(tags=None)
        w1_seconds, w1 = time.perf_counter() - t, self.read()
        after = (await gen.generate(prompt, greedy)).output_ids
        awake2 = self.read()
        await engine.sleep(level=2, mode="wait")
        s2 = self.read()
        await engine.wake_up(tags=["weights"])
        ww = self.read()
        await engine.wake_up(tags=["kv_cache"])
        wk = self.read()
        sleeping = await engine.is_sleeping()

        used = base.free - awake.free
        weights, kv = s2.free - ww.free, ww.free - wk.free
        runtime = plan1.budget - weights - kv
        rec.figure(
            "plan (models/memory.py engine_memory)",
            f"fraction {CUDA_FRACTION} of {_gib(self.total)} = "
            f"{_gib(plan1.budget)}: weights {_gib(plan1.weights)}, runtime {_gib(plan1.runtime)}, KV cache "
            f"{_gib(plan1.kv_cache)}; CUDA context {_gib(plan1.outside)}; asleep {_gib(plan1.asleep)}; host RAM "
            f"asleep {_gib(plan1.host_asleep)} (level 1) / {_gib(plan2.host_asleep)} (level 2)",
        )
        rec.figure(
            "awake: the engine's GPU memory",
            f"{_gib(used)} measured vs {_gib(plan1.budget + plan1.outside)} planned (fraction + CUDA context)",
        )
        rec.check(
            "awake: the engine's GPU memory <= the plan's fraction + CUDA context (+256 MiB)",
            used <= plan1.budget + plan1.outside + tol,
        )
        rec.check(
            "awake: the KV cache takes the fraction (engine memory >= fraction - planned runtime)",
            used >= plan1.budget - plan1.runtime,
        )
        self._level(rec, 1, awake, s1, w1, base, plan1, s1_seconds, w1_seconds)
        rec.check("level 1: greedy reply after wake_up = before the sleep (weights kept in host RAM)", after == before)
        self._level(rec, 2, awake2, s2, wk, base, plan2, None, None)
        rec.figure("level 2 wake_up(weights) / wake_up(kv_cache) re-take", f"{_gib(weights)} / {_gib(kv)}")
        rec.figure("weights", f"{_gib(weights)} measured vs {_gib(plan2.weights)} planned")
        rec.check(
            "weights woken = planned weights (+-10% + 32 MiB)",
            abs(weights - plan2.weights) <= WEIGHTS_REL_TOL * plan2.weights + (32 << 20),
        )
        rec.figure("KV cache", f"{_gib(kv)} measured vs {_gib(plan2.kv_cache)} planned")
        rec.check(
            "KV cache woken >= planned KV cache - 256 MiB (the plan's runtime term bounds the rest)",
            kv >= plan2.kv_cache - tol,
        )
        rec.figure(
            "runtime (fraction - weights - KV cache)", f"{_gib(runtime)} measured vs {_gib(plan2.runtime)} planned"
        )
        rec.check("runtime within the fraction <= planned runtime (+256 MiB)", runtime <= plan2.runtime + tol)
        rec.check("awake again after wake_up(weights) and wake_up(kv_cache)", not sleeping)

    def _level(
        self,
        rec: Record,
        level: int,
        awake: Reading,
        asleep: Reading,
        woken: Reading,
        base: Reading,
        plan,
        sleep_s: float | None,
        wake_s: float | None,
    ) -> None:
        tol = MEMORY_TOL
        freed, retaken, resident = asleep.free - awake.free, asleep.free - woken.free, base.free - asleep.free
        host, rss = awake.host_available - asleep.host_available, asleep.engine_rss - awake.engine_rss
        timing = "" if sleep_s is None else f"; sleep {sleep_s:.2f} s, wake_up {wake_s:.2f} s"
        nvml = (
            ""
            if asleep.nvml_free is None
            else f"; NVML free awake/asleep {_gib(awake.nvml_free)} / {_gib(asleep.nvml_free)}"
        )
        rec.figure(f"level {level}: GPU freed / re-taken by wake_up", f"{_gib(freed)} / {_gib(retaken)}{timing}{nvml}")
        rec.figure(f"level {level}: resident asleep", f"{_gib(resident)} measured vs {_gib(plan.asleep)} planned")
        rec.figure(
            f"level {level}: host RAM taken asleep",
            f"{_gib(host)} (system available; engine RSS {_gib(rss)}) vs {_gib(plan.host_asleep)} planned",
        )
        rec.check(
            f"level {level}: sleep frees the weights and the KV cache (>= planned weights + KV - 256 MiB)",
            freed >= plan.weights + plan.kv_cache - tol,
        )
        rec.check(f"level {level}: wake_up re-takes what the sleep freed (+-256 MiB)", abs(retaken - freed) <= tol)
        rec.check(f"level {level}: resident asleep <= planned (+256 MiB)", resident <= plan.asleep + tol)
        rec.check(f"level {level}: host RAM asleep <= planned (+256 MiB)", max(host, rss) <= plan.host_asleep + tol)
        if level == 1:
            rec.check(
                "level 1: host RAM holds the weights' backup (>= 80% of the planned weights)",
                max(host, rss) >= 0.8 * plan.weights,
            )

    async def check_ipc(self, rec: Record, gen, model: SmokeModel, ref, probe: list[int]) -> None:
        """The collocated route as the rollout worker runs it (``_serve_transfer``): ``VLLMGpuSync`` handles the
        producer's calls, then ``serve``; the probe against the producer's logits of the weights it sent."""
        import torch
        from smoke_vllm_compat import EngineCompat

        from rlinf_ext.protocol.generation import SamplingParams
        from rlinf_ext.sync.engine_calls import EngineCall
        from rlinf_ext.sync.vllm_engine_side import VLLMGpuSync
        from rlinf_ext.sync.vllm_transfer import FINISH, INIT, START, UPDATE

        engine = EngineCompat(gen.engine)
        sync = VLLMGpuSync(engine, "ipc", sleep_level=2)
        sync.next_version = 1  # the label FINISH gives the new weights (the rollout worker's, from the driver)
        old = reference_logits(ref, probe)  # the weights the engine holds now
        await sync.after_rollout()
        asleep = self.read()
        self.to_producer.put(("go", (model, probe)))
        calls, lowest, t = [], asleep.free, time.perf_counter()
        try:
            while True:
                kind, detail = await asyncio.to_thread(self.from_producer.get, True, PRODUCER_TIMEOUT_S)
                if kind == "failed":
                    raise RuntimeError(f"the producer process failed:\n{detail}")
                if kind == "done":
                    break
                method, payload = detail
                calls.append(method)
                try:
                    await sync.handle(EngineCall(method, payload))
                except Exception as exc:
                    self.to_producer.put(("error", f"{type(exc).__name__}: {exc}"))
                    raise
                lowest = min(lowest, torch.cuda.mem_get_info()[0])
                self.to_producer.put(("ok", None))
        finally:
            await sync.serve()  # as the rollout worker does: serve again whatever happened
        seconds = time.perf_counter() - t
        served = self.read()
        new_logits, figures = torch.from_numpy(detail[0]), detail[1]
        self.producer.join(timeout=60)
        plan = self.plan(model, 2)
        rec.figure("IPC route: trainer side", figures["trainer side"])
        rec.figure(
            "IPC route: engine-side adaptations (smoke_vllm_compat.EngineCompat)",
            ", ".join(sorted(engine.adaptations)) or "none",
        )
        rec.figure(
            "IPC route: calls",
            f"{calls[:1]} {calls[1:2]} {len([c for c in calls if c == UPDATE])} x "
            f"{UPDATE} {calls[-1:]}; {seconds:.2f} s from go to the last answer (producer: "
            f"{figures['seconds']:.2f} s sending, buffer {figures['buffer bytes'] >> 20} MiB, peak reserved "
            f"{_gib(figures['peak reserved'])})",
        )
        rec.figure(
            "IPC route: GPU in use, asleep / lowest free during the transfer / served",
            f"{_gib(self.base.free - asleep.free)} / {_gib(self.base.free - lowest)} (engine + producer) / "
            f"{_gib(self.base.free - served.free)}; the plan's engine while updating {_gib(plan.updating)}",
        )
        rec.check(
            "IPC route: INIT, START, one UPDATE per packed chunk (>= 2), FINISH, in order",
            calls[:2] == [INIT, START]
            and calls[-1:] == [FINISH]
            and len(calls) >= 5
            and all(c == UPDATE for c in calls[2:-1]),
        )
        rec.check(
            "IPC route: asleep after the rollout, resident <= planned (+256 MiB)",
            self.base.free - asleep.free <= plan.asleep + MEMORY_TOL,
        )
        rec.check(
            "IPC route: the engine serves again (nothing asleep, paused or mid-update)",
            not (sync.asleep or sync.paused or sync.updating) and not await gen.engine.is_sleeping(),
        )
        rec.check("IPC route: the producer process exited cleanly", self.producer.exitcode == 0)
        await check_probe(rec, gen, "IPC route", new_logits, old, probe, "cuda")
        reply = await gen.generate(probe[:8], SamplingParams(max_new_tokens=8, do_sample=False, stop=[]))
        rec.check("IPC route: generation after the sync", len(reply.output_ids) > 0)

    def close(self) -> None:
        if self.producer is not None and self.producer.is_alive():
            self.to_producer.put(("quit", None))
            self.producer.join(timeout=10)
            if self.producer.is_alive():
                self.producer.terminate()
