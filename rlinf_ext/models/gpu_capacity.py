"""The memory a GPU gives CUDA, which the memory plan checks each phase against: less than its nominal size (ECC and
the driver's reservations take their share), and what vLLM takes ``gpu_memory_utilization`` of
(vllm/v1/worker/utils.py ``request_memory``: ``total_memory x gpu_memory_utilization``, ``total_memory`` read by
``torch.cuda.mem_get_info``).

Read from the GPU itself where one of the configured kind is on this node (``local_gpu_total_bytes``, in a child
process), else from ``USABLE_GIB``. Each process's CUDA context is not taken off here: the plan counts it as a term of
its own (``models/memory.py``: ``CUDA_RESERVE_BYTES`` for the actor, ``VLLM_CUDA_CONTEXT_BYTES`` for each engine
worker), so taking it off here too would count it twice.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass

GIB = 2**30
# nominal GiB (cluster.gpu_memory_gib) -> (kind, the GiB torch reports as the device's total). The figures are the
# lowest "GPU 0 has a total capacity of X GiB" that torch's out-of-memory messages quoted in public issues and logs
# show for the kind: A100 40GB 39.25-39.56, A100 / H100 80GB 79.14-79.33, H200 139.72-139.81,
# B200 178.35-178.36. Not measured here: no GPU was at hand.
USABLE_GIB = {
    40: ("A100 40GB", 39.25),
    80: ("A100 / H100 80GB", 79.14),
    141: ("H200 141GB", 139.72),
    180: ("B200 180GB", 178.35),
}
# a size the table lacks: the lowest ratio in it (39.25 / 40) rounded down
UNLISTED_FRACTION = 0.98
# a reading of this node's GPU stands for the configured kind when it lies within this share below its nominal size
# (an 80 GiB config validated on an H200 node reads the table, not the H200)
SAME_KIND_FRACTION = 0.95
PROBE = "import torch; print(torch.cuda.mem_get_info(0)[1])"
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class GpuCapacity:
    """What a GPU of ``nominal_gib`` gives CUDA (``usable_bytes``) and where that figure comes from."""

    nominal_gib: float
    usable_bytes: int
    source: str

    @property
    def usable_gib(self) -> float:
        return self.usable_bytes / GIB


def gpu_capacity(nominal_gib: float, measured_bytes: int | None = None) -> GpuCapacity:
    """The usable memory of a ``nominal_gib`` GPU: ``measured_bytes`` (this node's GPU) when it reads as that kind,
    else the table's figure, else ``UNLISTED_FRACTION`` of the nominal size."""
    nominal = nominal_gib * GIB
    if measured_bytes is not None and SAME_KIND_FRACTION * nominal <= measured_bytes <= nominal:
        return GpuCapacity(nominal_gib, int(measured_bytes), "read from this node's GPU")
    listed = USABLE_GIB.get(round(nominal_gib)) if float(nominal_gib).is_integer() else None
    if listed is not None:
        kind, usable = listed
        return GpuCapacity(nominal_gib, int(usable * GIB), f"{kind}: the table's figure")
    return GpuCapacity(
        nominal_gib,
        int(UNLISTED_FRACTION * nominal),
        f"{UNLISTED_FRACTION:.0%} of the nominal size: no figure for a {nominal_gib:g} GiB GPU",
    )


@functools.cache
def local_gpu_total_bytes() -> int | None:
    """The total memory of this node's GPU 0 as CUDA reports it, or None without a GPU. Read in a child process:
    ``mem_get_info`` creates a CUDA context, which the launcher must not keep on a GPU its workers use."""
    import torch

    if torch.cuda.device_count() == 0:  # NVML or the driver's count: no context is created
        return None
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True
        )
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None  # the table stands in
