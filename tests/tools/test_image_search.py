"""The image-search tool: FVQA_Cache directories, the released pickle layout, the dummy backend."""

from __future__ import annotations

import asyncio
import json

import pytest
from image_cache_helpers import cache_pickle_bytes, encoded, opened
from PIL import Image

from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.tools.image_search import ImageSearch, ImageSearchError, UnsafeDataIdError, check_data_id

COLOURS = {"q-red": (220, 20, 20), "q-blue": (20, 20, 220), "q-green": (20, 200, 20)}


def _cfg(**kw) -> ImageSearchToolConfig:
    base = dict(topk=3, thumbnail_min_pixels=3136, thumbnail_max_pixels=3136)
    base.update(kw)
    return ImageSearchToolConfig(**base)


def _write_entry(root, data_id, titles, images, suffix=".png"):
    folder = root / data_id
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(
        json.dumps({"title_list": titles, "image_urls": [f"https://x.invalid/{i}" for i in range(len(titles))]})
    )
    for rank, image in enumerate(images):
        if image is not None:
            (folder / f"img_{rank:03d}{suffix}").write_bytes(encoded(image, "PNG" if suffix == ".png" else "JPEG"))


@pytest.fixture
def cache_dir(tmp_path):
    root = tmp_path / "fvqa_test_cache"
    for data_id, colour in COLOURS.items():
        _write_entry(root, data_id, [f"{data_id} page {k}" for k in range(4)], [Image.new("RGB", (70, 50), colour)] * 4)
    _write_entry(
        root,
        "q-holes",
        ["has image", "lost image", "jpeg image"],
        [Image.new("RGB", (56, 56), (5, 5, 5)), None],
        suffix=".png",
    )
    (root / "q-holes" / "img_002.jpg").write_bytes(encoded(Image.new("RGB", (56, 56), (9, 9, 9)), "JPEG"))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "meta.json").write_text(json.dumps({"title_list": ["secret"]}))
    (root / "link").symlink_to(tmp_path / "outside")
    return root


def test_cache_dir_hits_topk_and_canonical_thumbnails(cache_dir):
    tool = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir)))
    result = asyncio.run(tool.run("q-red"))
    assert result.ok and [h.title for h in result.hits] == ["q-red page 0", "q-red page 1", "q-red page 2"]
    assert [h.rank for h in result.hits] == [1, 2, 3] and result.hits[0].url == "https://x.invalid/0"
    thumb = result.hits[0].image
    assert (thumb.width, thumb.height) == (56, 56) and thumb.to_pil().getpixel((28, 28))[0] > 200
    assert tool.metadata()["backend"] == "cache_dir"


def test_image_search_is_a_registered_tool_whose_output_carries_the_thumbnails(cache_dir):
    from types import SimpleNamespace

    from rlinf_ext.tools.base import Tool, ToolContext
    from rlinf_ext.tools.registry import IMAGE_SEARCH, build_tools, resolve_tool

    assert resolve_tool(IMAGE_SEARCH) is ImageSearch and issubclass(ImageSearch, Tool)
    assert ImageSearch.stops() == ("</search>",) and ImageSearch.metric_names().calls == "image_searches"
    cfg = SimpleNamespace(
        tools=SimpleNamespace(image_search=_cfg(backend="cache_dir", cache_path=str(cache_dir))),
        runner=SimpleNamespace(seed=0),
    )
    (tool,) = build_tools([IMAGE_SEARCH], cfg, ToolContext())
    out = asyncio.run(tool.run("q-red"))
    assert out.ok and out.latency_s > 0 and tool.stats.calls == 1 and tool.stats.failures == 0
    assert [img.sha1 for img in out.images] == [h.image.sha1 for h in out.hits] and len(out.images) == 3
    assert out.body.count("<|vision_start|><|image_pad|><|vision_end|>") == 3 and "1. image:" in out.body
    assert "title: q-red page 2" in out.body


def test_data_id_travels_with_each_concurrent_call(cache_dir):
    """Regression for the fork's closure bug: every search of a round got the last trajectory's data_id."""
    tool = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir)))

    async def round_of_searches():
        return await asyncio.gather(*(tool.run(d) for d in ["q-red", "q-blue", "q-green", "q-red"]))

    results = asyncio.run(round_of_searches())
    for data_id, r in zip(["q-red", "q-blue", "q-green", "q-red"], results):
        assert r.hits[0].title.startswith(data_id)
        assert r.hits[0].image.to_pil().getpixel((28, 28)) == pytest.approx(COLOURS[data_id], abs=3)


@pytest.mark.parametrize(
    "bad", ["../fvqa_test_cache/q-red", "..", "/etc", "a/b", "a\\b", ".hidden", "", " q-red", "x\0y", None, 7]
)
def test_traversal_data_ids_are_refused(cache_dir, bad):
    tool = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir)))
    with pytest.raises(UnsafeDataIdError):
        asyncio.run(tool.run(bad))


def test_symlinked_entry_leaving_the_root_is_refused(cache_dir):
    tool = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir)))
    with pytest.raises(UnsafeDataIdError, match="outside the cache directory"):
        asyncio.run(tool.run("link"))


def test_cache_dir_miss_and_missing_images_per_mode(cache_dir):
    tool = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir)))
    miss = asyncio.run(tool.run("q-unknown"))
    assert not miss.ok and "q-unknown" in miss.error and tool.stats.failures == 1
    holes = asyncio.run(tool.run("q-holes"))
    assert holes.ok and [h.image is None for h in holes.hits] == [False, True, False]
    assert holes.missing_images == 1 and tool.missing_images == 1 and tool.stats.calls == 2
    placeholder = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir), on_missing_image="placeholder"))
    grey = asyncio.run(placeholder.run("q-holes")).hits[1].image
    assert grey.to_pil().getpixel((10, 10)) == (100, 100, 100)
    strict = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir), on_missing_image="error"))
    failed = asyncio.run(strict.run("q-holes"))
    assert not failed.ok and "no image" in failed.error
    raising = ImageSearch(_cfg(backend="cache_dir", cache_path=str(cache_dir), fail_on_miss=True))
    with pytest.raises(ImageSearchError, match="fail_on_miss"):
        asyncio.run(raising.run("q-unknown"))


def test_cache_pickle_backend_old_pillow_urls_and_miss(tmp_path):
    jpeg = opened(Image.new("RGB", (84, 56), (200, 100, 0)), "JPEG")
    entries = {
        "fvqa_test_0": {
            "tool_returned_web_title_list": ["Emblem of Drelia", "A url-only page"],
            "tool_returned_images_urls": [jpeg, "https://gone.invalid/404.jpg"],
        }
    }
    path = tmp_path / "fvqa_test_image_search_results_cache.pkl"
    path.write_bytes(cache_pickle_bytes(entries, old_pillow=True))
    tool = ImageSearch(_cfg(backend="cache_pickle", cache_path=str(path), thumbnail_max_pixels=12544))
    result = asyncio.run(tool.run("fvqa_test_0"))
    assert result.ok and [h.title for h in result.hits] == ["Emblem of Drelia", "A url-only page"]
    assert result.hits[0].image.to_pil().size == (84, 56) and result.hits[1].image is None
    assert result.hits[1].url == "https://gone.invalid/404.jpg" and result.missing_images == 1
    meta = tool.metadata()
    assert meta["entries"] == 1 and len(meta["sha256"]) == 64
    miss = asyncio.run(tool.run("fvqa_test_9"))
    assert not miss.ok and tool.stats.failures == 1


def test_dummy_backend_is_deterministic_and_has_a_miss():
    tool = ImageSearch(_cfg(backend="dummy", topk=2))
    a, b = asyncio.run(tool.run("q1")), asyncio.run(tool.run("q1"))
    assert a.ok and [h.image.sha1 for h in a.hits] == [h.image.sha1 for h in b.hits] and len(a.hits) == 2
    assert not asyncio.run(tool.run("miss-q1")).ok


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="cache_path is empty"):
        ImageSearch(_cfg(backend="cache_dir", cache_path=None))
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ImageSearch(_cfg(backend="cache_dir", cache_path=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="on_missing_image"):
        ImageSearch(_cfg(backend="dummy", on_missing_image="skip"))
    assert check_data_id("fvqa_train_00012") == "fvqa_train_00012"
