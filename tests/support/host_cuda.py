"""CUDA's device functions on a host without a GPU, each call checked against torch's own signature: for tests of
code that reads the current device, frees cached memory or asks for a GPU's UUID (the GPU weight-sync routes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from tests.support.signature_checks import checked_against

# torch's own functions, taken at import: a second install (another test, a forked rank) checks against these,
# never against an earlier stand-in
CUDA_FUNCTIONS = (
    "is_available",
    "current_device",
    "set_device",
    "get_device_properties",
    "current_stream",
    "synchronize",
    "ipc_collect",
    "empty_cache",
)
REAL_CUDA = {name: getattr(torch.cuda, name) for name in CUDA_FUNCTIONS}
REAL_ACCELERATOR = {name: getattr(torch.accelerator, name) for name in ("current_device_index", "synchronize")}


class HostStream:
    def synchronize(self) -> None:
        pass


class HostCuda:
    """``torch.cuda``'s device functions (and ``torch.accelerator``'s) on a host without CUDA, installed with
    ``install(setattr)`` (``monkeypatch.setattr``, or ``setattr`` in a process of its own). Device ``i``'s UUID
    is ``GPU-<i>``; each thread has its own current device, 0 until set (CUDA's rule); ``ipc_collect``,
    ``empty_cache`` and ``set_device`` are logged as ``("cuda", name, device)``."""

    def __init__(self, log: list | None = None):
        self.log = log if log is not None else []
        self._local = threading.local()

    def device(self) -> int:
        return getattr(self._local, "device", 0)

    def _set_device(self, device) -> None:
        self._local.device = int(device.index if isinstance(device, torch.device) else device)
        self.log.append(("cuda", "set_device", self.device()))

    def _properties(self, device=None):
        index = self.device() if device is None else int(getattr(device, "index", device))
        return SimpleNamespace(uuid=f"GPU-{index}", name=f"host stand-in for cuda:{index}")

    def _logged(self, name: str) -> Callable:
        def body(*args, **kwargs):
            self.log.append(("cuda", name, self.device()))

        return body

    def install(self, set_attribute: Callable[[Any, str, Any], None]) -> None:
        stand_ins = {
            "is_available": lambda: True,
            "current_device": self.device,
            "set_device": self._set_device,
            "get_device_properties": self._properties,
            "current_stream": lambda device=None: HostStream(),
            "synchronize": lambda device=None: None,
            "ipc_collect": self._logged("ipc_collect"),
            "empty_cache": self._logged("empty_cache"),
        }
        for name, body in stand_ins.items():
            set_attribute(torch.cuda, name, checked_against(REAL_CUDA[name])(body))
        set_attribute(
            torch.accelerator,
            "current_device_index",
            checked_against(REAL_ACCELERATOR["current_device_index"])(self.device),
        )
        set_attribute(
            torch.accelerator,
            "synchronize",
            checked_against(REAL_ACCELERATOR["synchronize"])(lambda device=None, /: None),
        )
