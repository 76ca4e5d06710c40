"""A real HTTP retrieval server for client fault tests: FastAPI + uvicorn on 127.0.0.1, in a thread.

It speaks `/retrieve` (docs/searchr1-facts.md §2) and can be told to be slow, to fail with 5xx a number of times,
or to answer with a fixed status. It records the arrival time of every request.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


@dataclass
class StubBehaviour:
    delay_s: float = 0.0
    fail_first: int = 0  # answer 500 to this many requests first
    status: int | None = None  # answer every request with this status
    arrivals: list[float] = field(default_factory=list)


def make_app(behaviour: StubBehaviour) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest):
        behaviour.arrivals.append(time.monotonic())
        if behaviour.delay_s:
            await asyncio.sleep(behaviour.delay_s)
        if behaviour.status is not None:
            return JSONResponse({"detail": "stub error"}, status_code=behaviour.status)
        if len(behaviour.arrivals) <= behaviour.fail_first:
            return JSONResponse({"detail": "stub overloaded"}, status_code=500)
        topk = request.topk or 3
        result = []
        for query in request.queries:
            rows = [
                {
                    "id": str(k),
                    "contents": f'"Title {k}"\nPassage {k} about {query}.',
                    "url": f"https://en.wikipedia.org/wiki/T{k}",
                }
                for k in range(topk)
            ]
            result.append(
                [{"document": r, "score": 1.0 - k / 10} for k, r in enumerate(rows)] if request.return_scores else rows
            )
        return {"result": result}

    return app


class StubServer:
    """`with StubServer() as s: s.url` - serves until the block ends."""

    def __init__(self, behaviour: StubBehaviour | None = None, host: str = "127.0.0.1"):
        self.behaviour = behaviour or StubBehaviour()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))  # another loopback address (127.0.0.2) stands for another node's IP
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            make_app(self.behaviour), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "StubServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("stub retrieval server did not start in 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def unused_port(host: str = "127.0.0.1") -> int:
    """A port with nothing listening (bound then released)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
