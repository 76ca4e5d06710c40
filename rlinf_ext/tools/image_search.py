"""The image-search tool of MMSearch-R1: cached results per question, looked up by `data_id`.

Backends (`tools.image_search.backend`):
- `cache_dir`: the FVQA_Cache layout, `<cache_path>/<data_id>/meta.json` (`title_list`, `image_urls`) plus
  `img_000.jpg|png|...` by rank;
- `cache_pickle`: the released `*_image_search_results_cache.pkl`, read once per process by the restricted
  unpickler of `safe_pickle` (no code runs; its sha256 goes into the run metadata);
- `dummy`: deterministic titles and solid-colour thumbnails derived from the `data_id` (engine-free tests);
  a `data_id` starting with `miss-` has no results, so dry runs can exercise the miss path too.

`ImageSearch` is a `Tool`: the loop calls `run(data_id)` (timed, counted, charged like the text tools) and gets
an `ImageSearchOutput`, whose `images` are the thumbnails its `body`'s placeholders stand for. The `data_id` is
the call's content, never state of the tool: the widely used fork closed over the
last trajectory's id, so every image search of a round got one trajectory's results. A `data_id` is a single
path component; one that could leave the cache directory is refused. Thumbnails are canonicalised
(`protocol.images`). A miss (no entry) is a failed call (`stats.failures`), a missing thumbnail is counted
(`missing_images`); both are handled as the config says (`on_missing_image`; a miss becomes the loop's
failure observation, or an error with `fail_on_miss`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_ext.protocol.images import ImageError, ImageRef, canonicalize, encode_png
from rlinf_ext.protocol.vl_tokens import IMAGE_PLACEHOLDER
from rlinf_ext.tools.base import Tool, ToolContext, ToolMetricNames, ToolOutput
from rlinf_ext.tools.safe_pickle import PickledImage, image_from_state, load_cache_pickle

BACKENDS = ("cache_dir", "cache_pickle", "dummy")
MISSING_IMAGE_MODES = ("title_only", "placeholder", "error")
IMAGE_SUFFIXES = (".jpg", ".png", ".jpeg", ".webp")
PICKLE_TITLES = "tool_returned_web_title_list"
PICKLE_IMAGES = "tool_returned_images_urls"
PLACEHOLDER_GREY = 100  # the fork's placeholder is a flat grey square
DUMMY_MISS_PREFIX = "miss-"


class ImageSearchError(RuntimeError):
    """Raised instead of a failed result when `fail_on_miss` is set, or for a missing image in `error` mode."""


class UnsafeDataIdError(ValueError):
    """A data_id that is not a single, plain path component."""


@dataclass(frozen=True)
class ImageHit:
    rank: int  # 1-based
    title: str
    image: ImageRef | None  # None: no thumbnail available (title only)
    url: str | None = None


@dataclass
class ImageSearchOutput(ToolOutput):
    """A call's `ToolOutput` (`body`: the ranked hits, one placeholder per thumbnail in `images`) plus the hits
    themselves and how many lacked a thumbnail."""

    hits: list[ImageHit] = field(default_factory=list)
    missing_images: int = 0


# MMSearch-R1's metric names (agent/image_searches, agent/image_search_failures, ...), kept from before the Tool
IMAGE_SEARCH_METRICS = ToolMetricNames(
    calls="image_searches",
    failures="image_search_failures",
    latency_s="image_search_latency_s",
    failure_rate="image_search_failure_rate",
)


@dataclass(frozen=True)
class RawHit:
    """What a backend found before canonicalisation: a title, maybe image bytes, maybe a URL."""

    title: str
    image: bytes | None
    url: str | None = None


def check_data_id(data_id: Any) -> str:
    """A non-empty single path component without separators, NUL, or a leading dot."""
    if not isinstance(data_id, str) or not data_id:
        raise UnsafeDataIdError(f"data_id must be a non-empty string, got {data_id!r}")
    if any(c in data_id for c in ("/", "\\", "\0")) or data_id.startswith(".") or data_id != data_id.strip():
        raise UnsafeDataIdError(
            f"data_id {data_id!r} is not a plain name (no '/', '\\\\', NUL, leading dot or "
            "surrounding spaces); it keys a cache directory and must stay inside it"
        )
    return data_id


class CacheDirBackend:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"tools.image_search.cache_path {root} is not a directory (FVQA_Cache layout: "
                "<cache_path>/<data_id>/meta.json + img_000.jpg ...)"
            )

    def describe(self) -> dict:
        return {"cache_path": str(self.root)}

    def lookup(self, data_id: str) -> list[RawHit] | None:
        folder = (self.root / check_data_id(data_id)).resolve()
        if folder.parent != self.root:  # e.g. a symlink pointing elsewhere
            raise UnsafeDataIdError(f"data_id {data_id!r} resolves outside the cache directory {self.root}")
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{meta_path}: not valid JSON ({exc}); rebuild this cache entry") from None
        titles = [str(t) for t in meta.get("title_list") or []]
        urls = list(meta.get("image_urls") or [])
        hits = []
        for rank, title in enumerate(titles):
            found = [folder / f"img_{rank:03d}{s}" for s in IMAGE_SUFFIXES if (folder / f"img_{rank:03d}{s}").is_file()]
            url = urls[rank] if rank < len(urls) and isinstance(urls[rank], str) else None
            hits.append(RawHit(title, found[0].read_bytes() if found else None, url))
        return hits


class CachePickleBackend:
    def __init__(self, path: str | Path, max_bytes: int):

        loaded = load_cache_pickle(path, max_bytes)
        if not isinstance(loaded.data, dict):
            raise ValueError(f"{path}: the cache must be a dict keyed by data_id, got {type(loaded.data).__name__}")
        self.path, self.sha256, self.size_bytes = str(Path(path).resolve()), loaded.sha256, loaded.size_bytes
        self.entries: dict[str, list[RawHit]] = {}
        for data_id, entry in loaded.data.items():
            titles = [str(t) for t in (entry or {}).get(PICKLE_TITLES) or []]
            items = list((entry or {}).get(PICKLE_IMAGES) or [])
            hits = []
            for rank, title in enumerate(titles):
                item = items[rank] if rank < len(items) else None
                if isinstance(item, PickledImage):  # re-encoded once, here
                    hits.append(RawHit(title, encode_png(image_from_state(item))))
                else:  # a URL (offline: no thumbnail) or nothing
                    hits.append(RawHit(title, None, item if isinstance(item, str) else None))
            self.entries[str(data_id)] = hits

    def describe(self) -> dict:
        return {
            "cache_path": self.path,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "entries": len(self.entries),
        }

    def lookup(self, data_id: str) -> list[RawHit] | None:
        return self.entries.get(check_data_id(data_id))


class DummyImageBackend:
    def __init__(self, topk: int):
        self.topk = topk

    def describe(self) -> dict:
        return {}

    def lookup(self, data_id: str) -> list[RawHit] | None:
        from PIL import Image

        if check_data_id(data_id).startswith(DUMMY_MISS_PREFIX):
            return None
        digest = hashlib.sha1(data_id.encode("utf-8")).digest()
        hits = []
        for k in range(self.topk):
            colour = tuple(digest[(3 * k + i) % len(digest)] for i in range(3))
            hits.append(RawHit(f"Dummy result {k + 1} for {data_id}", encode_png(Image.new("RGB", (56, 56), colour))))
        return hits


def check_image_search_config(cfg: Any) -> None:
    if cfg.backend not in BACKENDS:
        raise ValueError(f"tools.image_search.backend must be one of {BACKENDS}, got {cfg.backend!r}")
    if cfg.backend != "dummy" and not cfg.cache_path:
        raise ValueError(
            f"tools.image_search.cache_path is empty; backend {cfg.backend} needs the cache "
            "(a FVQA_Cache directory or the .pkl file), or use backend: dummy"
        )
    if cfg.on_missing_image not in MISSING_IMAGE_MODES:
        raise ValueError(
            f"tools.image_search.on_missing_image must be one of {MISSING_IMAGE_MODES}, got {cfg.on_missing_image!r}"
        )
    if int(cfg.topk) < 1:
        raise ValueError(f"tools.image_search.topk must be >= 1, got {cfg.topk}")


def make_image_backend(cfg: Any):
    if cfg.backend == "cache_dir":
        return CacheDirBackend(cfg.cache_path)
    if cfg.backend == "cache_pickle":
        return CachePickleBackend(cfg.cache_path, int(cfg.max_cache_bytes))
    return DummyImageBackend(int(cfg.topk))


def results_body(hits: list[ImageHit]) -> tuple[str, list[ImageRef]]:
    """Ranked hits as text with one image placeholder per thumbnail (hits without one show the title only)."""
    lines, images = [], []
    for hit in hits:
        if hit.image is not None:
            lines.append(f"{hit.rank}. image: {IMAGE_PLACEHOLDER}\ntitle: {hit.title}\n")
            images.append(hit.image)
        else:
            lines.append(f"{hit.rank}. title: {hit.title}\n")
    return "".join(lines), images


class ImageSearch(Tool):
    """MMSearch-R1's `<search><img></search>`: the cached results of the task's image. The content of a call is
    the task's `data_id` (the loop passes it; the model's call carries only `<img>`)."""

    name = "image_search"
    tag = "search"  # the call is <search><img></search>; MMSearch-R1's text search is <text_search>
    instruction = "If I want to search the web for the image, I should write <search><img></search>."
    metric_names_override = IMAGE_SEARCH_METRICS

    def __init__(self, cfg: Any):
        check_image_search_config(cfg)
        self.cfg = cfg
        self.backend = make_image_backend(cfg)
        self.missing_images = 0  # over the tool's life (each call's own count: ImageSearchOutput.missing_images)
        self._min, self._max = int(cfg.thumbnail_min_pixels), int(cfg.thumbnail_max_pixels)

    @classmethod
    def from_config(cls, cfg: Any, context: ToolContext) -> "ImageSearch":
        return cls(cfg.tools.image_search)

    def metadata(self) -> dict:
        """What a run records about its image-search source (backend, path, sha256 of a pickle)."""
        return {"backend": self.cfg.backend, "topk": int(self.cfg.topk), **self.backend.describe()}

    async def __call__(self, content: str) -> ImageSearchOutput:
        output = self._search(content)
        self.missing_images += output.missing_images
        if not output.ok and self.cfg.fail_on_miss:
            raise ImageSearchError(
                f"image search for data_id {content!r} failed: {output.error} "
                "(set tools.image_search.fail_on_miss: false to continue with a failure observation)"
            )
        return output

    def _search(self, data_id: str) -> ImageSearchOutput:
        raw = self.backend.lookup(data_id)
        if not raw:
            error = f"no cached image search results for data_id {data_id!r}"
            return ImageSearchOutput(body=error, ok=False, error=error)
        hits, missing = [], 0
        for rank, item in enumerate(raw[: int(self.cfg.topk)], start=1):
            image = self._thumbnail(item, data_id, rank)
            if image is None:
                missing += 1
                if self.cfg.on_missing_image == "error":
                    error = f"result {rank} of data_id {data_id!r} has no image"
                    return ImageSearchOutput(body=error, ok=False, error=error, missing_images=missing)
                if self.cfg.on_missing_image == "placeholder":
                    image = self._placeholder()
            hits.append(ImageHit(rank, item.title, image, item.url))
        body, images = results_body(hits)
        return ImageSearchOutput(body=body, images=images, hits=hits, missing_images=missing)

    def _thumbnail(self, item: RawHit, data_id: str, rank: int) -> ImageRef | None:
        if item.image is None:
            return None
        try:
            return canonicalize(item.image, self._min, self._max, what=f"data_id {data_id!r} result {rank}")
        except ImageError:  # an undecodable thumbnail counts as missing, like an absent file
            return None

    def _placeholder(self) -> ImageRef:
        from PIL import Image

        return canonicalize(Image.new("RGB", (56, 56), (PLACEHOLDER_GREY,) * 3), self._min, self._max)
