"""The restricted cache unpickler: Pillow-old and Pillow-new states load pixel-identically; code never runs."""

from __future__ import annotations

import os
import pickle

import pytest
from image_cache_helpers import cache_pickle_bytes, opened
from PIL import Image

from rlinf_ext.tools.safe_pickle import (
    CacheUnpickler,
    PickledImage,
    UnsafePickleError,
    image_from_state,
    load_cache_pickle,
)


def _gradient(mode: str) -> Image.Image:
    base = Image.linear_gradient("L").resize((40, 24)).convert("RGB")
    base.putpixel((3, 4), (250, 10, 10))
    if mode == "P":
        return base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return base.convert(mode)


def test_old_pillow_state_breaks_stock_pickle_but_not_ours(tmp_path):
    jpeg = opened(_gradient("RGB"), "JPEG")
    old = cache_pickle_bytes(
        {"q1": {"tool_returned_web_title_list": ["t"], "tool_returned_images_urls": [jpeg]}}, old_pillow=True
    )
    with pytest.raises(ValueError, match="not enough values to unpack"):
        pickle.loads(old)  # the reported failure (multimodal-search-r1 issues #9, #26)
    new = cache_pickle_bytes({"q1": {"tool_returned_web_title_list": ["t"], "tool_returned_images_urls": [jpeg]}})
    (tmp_path / "old.pkl").write_bytes(old)
    (tmp_path / "new.pkl").write_bytes(new)
    images = []
    for name in ("old.pkl", "new.pkl"):
        loaded = load_cache_pickle(tmp_path / name, max_bytes=1 << 20)
        record = loaded.data["q1"]["tool_returned_images_urls"][0]
        assert isinstance(record, PickledImage) and record.class_name == "PIL.JpegImagePlugin.JpegImageFile"
        images.append(image_from_state(record))
    assert len(pickle.loads(new)["q1"]["tool_returned_images_urls"][0].__getstate__()) == 8
    reference = jpeg.convert("RGB")
    assert all(im.tobytes() == reference.tobytes() and im.size == reference.size for im in images)


@pytest.mark.parametrize("mode,fmt", [("RGB", "PNG"), ("P", "PNG"), ("L", "PNG"), ("RGBA", "PNG"), ("L", "JPEG")])
def test_modes_rebuild_pixel_identically(mode, fmt):
    image = opened(_gradient(mode), fmt)
    record = CacheUnpickler(__import__("io").BytesIO(pickle.dumps(image))).load()
    assert image_from_state(record).tobytes() == image.convert("RGB").tobytes()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_refuses_code_and_the_code_does_not_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(
        pickle.dumps({"q1": {"tool_returned_web_title_list": ["t"], "tool_returned_images_urls": [_RunsCode(marker)]}})
    )
    with pytest.raises(UnsafePickleError, match=r"refused global (posix|os|nt)\.system"):
        load_cache_pickle(path, max_bytes=1 << 20)
    assert not marker.exists()
    path.write_bytes(pickle.dumps({"x": eval}))
    with pytest.raises(UnsafePickleError, match="builtins.eval"):
        load_cache_pickle(path, max_bytes=1 << 20)


def test_size_limit_and_unknown_state(tmp_path):
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps({"q": {"tool_returned_web_title_list": ["t" * 1000]}}))
    with pytest.raises(ValueError, match="max_cache_bytes"):
        load_cache_pickle(path, max_bytes=100)
    loaded = load_cache_pickle(path, max_bytes=1 << 20)
    assert len(loaded.sha256) == 64 and loaded.size_bytes == path.stat().st_size
    odd = PickledImage()
    odd.state = {"not": "a list"}
    with pytest.raises(ValueError, match="unknown state layout"):
        image_from_state(odd)
