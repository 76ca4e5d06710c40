"""FastAPI retrieval server: ``POST /retrieve``, ``POST /access``, ``GET /health`` (docs/searchr1-facts.md §2 wire format).

Requests are validated strictly (unknown fields, wrong types, empty queries, limits) and answered 4xx
with a message; the search itself goes through the cross-request batcher (``batching.py``) or, with
``no_batching``, through one worker thread one request at a time (the peers' behaviour, for comparison).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from .batching import QueryBatcher
from .config import ServerConfig, search_params
from .corpus import CorpusStore, PagesStore, file_fingerprint, plain_corpus_path
from .hub import resolve_model_dir
from .memory import process_memory
from .metadata import IndexMetadata, check_matches, model_fingerprint
from .open import open_searcher
from .searcher import Searcher


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


class AccessRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    urls: list[StrictStr]


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Backend:
    """Everything a running server serves from (opened once at start-up)."""

    searcher: Searcher
    store: CorpusStore
    pages: PagesStore | None
    meta: IndexMetadata
    searcher_open_s: float = 0.0  # seconds to open the searcher (encoder + index); memory-mapped: the index is ~0 of it


def open_backend(cfg: ServerConfig) -> Backend:
    """Open index + corpus (+ pages) and refuse an index that does not match them (IndexMismatchError)."""
    meta = IndexMetadata.load(cfg.index)
    corpus = plain_corpus_path(cfg.corpus, show_progress=True) if Path(cfg.corpus).is_file() else Path(cfg.corpus)
    corpus_checksum = file_fingerprint(corpus) if corpus.is_file() else "missing"
    model = str(resolve_model_dir(cfg.model)) if cfg.model else None  # a hub id: its local snapshot
    # Checksum first: a mismatched 20 GB corpus is refused before its offsets are scanned.
    check_matches(
        meta,
        corpus_checksum=corpus_checksum,
        passages=meta.passages,
        retriever=cfg.retriever,
        model_checksum=model_fingerprint(model) if model else None,
        index_dir=cfg.index,
    )
    store = CorpusStore.open(corpus, cache_dir=cfg.index, show_progress=True)
    check_matches(meta, corpus_checksum=corpus_checksum, passages=len(store), index_dir=cfg.index)
    device = cfg.device
    if device == "auto" and meta.retriever != "bm25":  # torch is imported only for dense indexes
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    searcher, _ = open_searcher(
        cfg.index,
        model=model,
        device=device,
        gpus=cfg.gpus,
        threads=cfg.threads,
        in_ram=cfg.in_ram,
        search_params=search_params(cfg),
    )
    open_s = time.perf_counter() - started
    pages = PagesStore.open(cfg.pages, cache_dir=cfg.index, show_progress=True) if cfg.pages else None
    return Backend(searcher=searcher, store=store, pages=pages, meta=meta, searcher_open_s=open_s)


def _json(payload, status: int = 200) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json"
    )


def _error(status: int, message: str) -> Response:
    return _json({"detail": message}, status)


async def _read_json_body(request: Request, max_bytes: int):
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BadRequest(
            413,
            f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes "
            "(send fewer queries per request or raise --max-body-bytes)",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BadRequest(
                413,
                f"request body exceeds the limit of {max_bytes} bytes "
                "(send fewer queries per request or raise --max-body-bytes)",
            )
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as e:
        raise BadRequest(
            400,
            f"body is not valid JSON ({e}); send e.g. "
            '{"queries": ["who wrote hamlet"], "topk": 3, "return_scores": false}',
        ) from e


def _validate(model, payload):
    if not isinstance(payload, dict):
        raise BadRequest(422, f"body must be a JSON object, got {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())
        allowed = ", ".join(model.model_fields)
        raise BadRequest(422, f"invalid {model.__name__}: {problems} (allowed fields: {allowed})") from e


def check_retrieve_limits(req: RetrieveRequest, cfg: ServerConfig) -> int:
    """Apply the server's limits; return the effective topk (null → server default)."""
    if not req.queries:
        raise BadRequest(422, "queries is empty; send at least one query string")
    if len(req.queries) > cfg.max_queries:
        raise BadRequest(
            422, f"{len(req.queries)} queries in one request exceeds the limit of {cfg.max_queries}; split the request"
        )
    for i, q in enumerate(req.queries):
        if not q.strip():
            raise BadRequest(422, f"queries[{i}] is empty or whitespace; every query needs some text")
        if len(q) > cfg.max_query_chars:
            raise BadRequest(
                422, f"queries[{i}] has {len(q)} characters, above the limit of {cfg.max_query_chars}; shorten it"
            )
    topk = cfg.topk if req.topk is None else req.topk
    if not 1 <= topk <= cfg.max_topk:
        raise BadRequest(422, f"topk={topk} is outside 1..{cfg.max_topk}")
    return topk


def create_app(cfg: ServerConfig, backend: Backend, address_file: Path | None = None) -> FastAPI:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-search")
    batcher = (
        None
        if cfg.no_batching
        else QueryBatcher(backend.searcher.search, executor, cfg.max_batch_size, cfg.max_wait_ms / 1000.0)
    )
    waiting = {"unbatched": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if batcher is not None:
            batcher.start()
        if address_file is not None:
            write_address_file(address_file, cfg.host, app.state.port)
        try:
            yield
        finally:
            if address_file is not None:
                address_file.unlink(missing_ok=True)
            if batcher is not None:
                await batcher.stop()
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="rlinf_ext retrieval server", lifespan=lifespan)
    app.state.port = cfg.port

    async def search(queries: list[str], k: int):
        if batcher is not None:
            return await batcher.submit(queries, k)
        waiting["unbatched"] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, backend.searcher.search, queries, k)
        finally:
            waiting["unbatched"] -= 1

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        try:
            req = _validate(RetrieveRequest, await _read_json_body(request, cfg.max_body_bytes))
            topk = check_retrieve_limits(req, cfg)
        except BadRequest as e:
            return _error(e.status, e.message)
        try:
            scores, rows = await search(req.queries, topk)
        except Exception as e:  # noqa: BLE001 - logged with its traceback; the server keeps serving
            traceback.print_exc()
            return _error(500, f"search failed: {type(e).__name__}: {e}")
        result = []
        for q_scores, q_rows in zip(scores, rows):
            found = q_rows >= 0  # an approximate index marks "fewer than k found" with -1
            q_scores, q_rows = q_scores[found], q_rows[found]
            docs = backend.store.get_many(q_rows)
            if req.return_scores:
                result.append([{"document": d, "score": float(s)} for d, s in zip(docs, q_scores)])
            else:
                result.append(docs)
        return _json({"result": result})

    @app.post("/access")
    async def access(request: Request) -> Response:
        try:
            req = _validate(AccessRequest, await _read_json_body(request, cfg.max_body_bytes))
            if backend.pages is None:
                raise BadRequest(404, "this server has no pages file; start it with --pages wiki_webpages.jsonl")
            if len(req.urls) > cfg.max_queries:
                raise BadRequest(422, f"{len(req.urls)} urls exceeds the limit of {cfg.max_queries}")
        except BadRequest as e:
            return _error(e.status, e.message)
        return _json({"result": [backend.pages.lookup(u) for u in req.urls]})

    @app.get("/health")
    async def health() -> Response:
        depth = batcher.queue_depth if batcher is not None else waiting["unbatched"]
        return _json(
            {
                "status": "ok",
                "passages": len(backend.store),
                "retriever": backend.meta.retriever,
                "index_type": backend.searcher.index_type,
                "model": backend.meta.model,
                "pages": len(backend.pages) if backend.pages is not None else None,
                "batching": batcher is not None,
                "max_batch_size": cfg.max_batch_size,
                "queue_depth": depth,
                "batches_run": batcher.batches_run if batcher is not None else None,
                "default_topk": cfg.topk,
                "memory_mapped": backend.searcher.memory_mapped,
                "search_params": backend.searcher.search_params,
                "audit": backend.meta.audit,
                "memory": process_memory(),
                "searcher_open_s": backend.searcher_open_s,
            }
        )

    return app


def address_file_path(directory: str | os.PathLike, host: str, port: int) -> Path:
    """ASearcher's per-server address file name, so several servers can share one directory."""
    return Path(directory) / f"Host{host}_IP{port}.txt"


def write_address_file(path: Path, host: str, port: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{host}:{port}")
    os.replace(tmp, path)  # readers never see a half-written file


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen before the app starts so ``port=0`` yields a known free port with no race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot bind {host}:{port} ({e.strerror}); pick another --port or pass --port 0") from e
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(cfg: ServerConfig) -> int:
    import uvicorn

    t0 = time.perf_counter()
    backend = open_backend(cfg)
    sock = bind_socket(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    address_file = address_file_path(cfg.save_address_to, cfg.host, port) if cfg.save_address_to else None
    app = create_app(cfg, backend, address_file)
    app.state.port = port
    print(
        f"retrieval server: {backend.meta.retriever} index over {len(backend.store)} passages, "
        f"listening on http://{cfg.host}:{port} (opened in {time.perf_counter() - t0:.1f}s, "
        f"{'memory-mapped' if backend.searcher.memory_mapped else 'in RAM'}, "
        f"batching {'off' if cfg.no_batching else 'on'})",
        flush=True,
    )
    config = uvicorn.Config(app, log_level=cfg.log_level, access_log=False, timeout_keep_alive=30)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        if address_file is not None:
            address_file.unlink(missing_ok=True)
        sock.close()
    return 0
