"""Start / stop a retrieval server in a background process (for the run launcher, benchmarks and tests).

    with RetrievalServerProcess(index_dir, corpus_path) as url:   # waits for GET /health
        httpx.post(f"{url}/retrieve", json={"queries": ["..."], "topk": 3})

The server binds a free port on 127.0.0.1 unless ``port``/``host`` say otherwise; the chosen address is
read from the address file the server writes (a private temp dir unless ``save_address_to`` is given).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


class RetrievalServerError(RuntimeError):
    """The server process exited or did not become healthy in time; the message carries its output."""


class RetrievalServerProcess:
    def __init__(
        self,
        index_dir: str | os.PathLike,
        corpus: str | os.PathLike,
        *,
        pages: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        topk: int = 3,
        model: str | None = None,
        retriever: str | None = None,
        no_batching: bool = False,
        max_batch_size: int | None = None,
        max_wait_ms: float | None = None,
        threads: int | None = None,
        in_ram: bool = False,
        nprobe: int | None = None,
        ef_search: int | None = None,
        k_factor: int | None = None,
        save_address_to: str | os.PathLike | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        args = [
            "--index",
            str(index_dir),
            "--corpus",
            str(corpus),
            "--host",
            host,
            "--port",
            str(port),
            "--topk",
            str(topk),
        ]
        for flag, value in (
            ("--pages", pages),
            ("--model", model),
            ("--retriever", retriever),
            ("--max-batch-size", max_batch_size),
            ("--max-wait-ms", max_wait_ms),
            ("--threads", threads),
            ("--nprobe", nprobe),
            ("--ef-search", ef_search),
            ("--k-factor", k_factor),
        ):
            if value is not None:
                args += [flag, str(value)]
        if no_batching:
            args.append("--no-batching")
        if in_ram:
            args.append("--in-ram")
        # Private scratch dir for the log (and the address file unless the caller shares a directory:
        # clients read every file in an address directory, so the log never goes there).
        self._scratch = Path(tempfile.mkdtemp(prefix="retriever-"))
        self.address_dir = Path(save_address_to) if save_address_to else self._scratch / "addr"
        args += ["--save-address-to", str(self.address_dir)] + list(extra_args or [])
        self.command = [sys.executable, "-m", "rlinf_ext.cli", "serve-retriever", *args]
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else self._scratch / "server.log"
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self.startup_s: float | None = None

    def start(self) -> str:
        """Start the server and return its base URL once GET /health answers."""
        # this server's file: its host in the name (servers of other nodes may share a directory and start
        # at the same moment), and not one that was there before it started
        pattern = f"Host{self.host}_IP*.txt"
        known = set(self.address_dir.glob(pattern)) if self.address_dir.exists() else set()
        self.address_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the server process
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = t0 + self.startup_timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                output = self.output()
                self.stop()  # closes the log and removes the scratch dir
                raise RetrievalServerError(f"retrieval server exited with code {self.process.returncode}:\n{output}")
            if self.url is None:
                new = [p for p in self.address_dir.glob(pattern) if p not in known]
                if new:
                    self.url = "http://" + new[0].read_text().strip()
            if self.url is not None:
                try:
                    if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                        self.startup_s = time.perf_counter() - t0
                        return self.url
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        output = self.output()
        self.stop()
        raise RetrievalServerError(f"retrieval server not healthy after {self.startup_timeout_s}s:\n{output}")

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful: the server removes its address file), then SIGKILL if it does not exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
