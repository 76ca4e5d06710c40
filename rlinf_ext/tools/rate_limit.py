"""A process-wide token bucket for search requests.

Implemented as a reservation schedule (GCRA, equivalent to a token bucket): each caller reserves the next
free send time under a threading lock and then sleeps until it. No asyncio primitive is involved, so one
bucket serves every coroutine, event loop and thread of the process and never dies with an actor.
"""

from __future__ import annotations

import asyncio
import threading
import time


class TokenBucket:
    def __init__(self, rate: float, burst: int = 1):
        if rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {rate}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.rate = float(rate)
        self.burst = int(burst)
        self._interval = 1.0 / self.rate
        self._tolerance = (self.burst - 1) * self._interval
        self._theoretical_arrival = 0.0
        self._lock = threading.Lock()

    def reserve(self, now: float | None = None) -> float:
        """Reserve one token; return how long the caller must wait before using it (seconds, >= 0)."""
        with self._lock:
            now = time.monotonic() if now is None else now
            tat = max(self._theoretical_arrival, now)
            send_at = max(now, tat - self._tolerance)
            self._theoretical_arrival = tat + self._interval
            return send_at - now

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)


_SHARED: dict[tuple[float, int], TokenBucket] = {}
_SHARED_LOCK = threading.Lock()


def shared_token_bucket(rate: float | None, burst: int = 1) -> TokenBucket | None:
    """The process's bucket for this rate (None when unlimited). Same rate -> same bucket object."""
    if not rate:
        return None
    key = (float(rate), int(burst))
    with _SHARED_LOCK:
        bucket = _SHARED.get(key)
        if bucket is None:
            bucket = _SHARED[key] = TokenBucket(rate, burst)
        return bucket
