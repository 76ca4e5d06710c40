"""Resident memory of this process, and its peak over a block (sampled every millisecond in a thread): what the
CPU memory benchmarks and the smoke script's CPU stages measure."""

from __future__ import annotations

import os
import threading
import time


def rss() -> int:
    """Bytes resident now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """``with PeakRSS() as p: ...`` -> ``p.peak``: the largest ``rss()`` seen inside the block."""

    def __enter__(self) -> PeakRSS:
        self.peak, self._stop = rss(), False
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop = True
        self.thread.join()
        self.peak = max(self.peak, rss())
