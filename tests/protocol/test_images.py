"""Image canonicalisation: the processor's own resize and token count agree with ours on canonical images."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from rlinf_ext.protocol.images import ImageError, ImageRef, canonical_size, canonicalize, is_canonical


def _jpeg(size, mode="RGB", colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour if mode == "RGB" else 128).save(out, format="JPEG")
    return out.getvalue()


@pytest.mark.parametrize("size", [(100, 37), (640, 480), (56, 56), (29, 200), (1000, 1000)])
def test_canonical_sides_and_pixels(size):
    ref = canonicalize(_jpeg(size), min_pixels=3136, max_pixels=112 * 112)
    assert ref.width % 28 == 0 and ref.height % 28 == 0
    assert 3136 <= ref.width * ref.height <= 112 * 112
    assert is_canonical(ref.width, ref.height, 3136, 112 * 112)
    image = ref.to_pil()
    assert image.mode == "RGB" and image.size == (ref.width, ref.height)


def test_canonical_is_a_fixed_point_and_the_hf_processor_keeps_the_grid():
    from transformers import Qwen2VLImageProcessor

    ref = canonicalize(Image.new("L", (300, 170), 90), min_pixels=3136, max_pixels=200704)
    again = canonicalize(ref.data, min_pixels=3136, max_pixels=200704)
    assert again == ref  # bytes kept, same sha1
    assert canonicalize(ref.to_pil(), 3136, 200704).sha1 == ref.sha1  # PNG encoding is deterministic
    proc = Qwen2VLImageProcessor(min_pixels=3136, max_pixels=200704, patch_size=14, temporal_patch_size=2, merge_size=2)
    grid = proc(images=[ref.to_pil()], return_tensors="pt").image_grid_thw[0].tolist()
    assert grid == [1, ref.height // 14, ref.width // 14]
    assert grid[1] * grid[2] // 4 == ref.tokens


def test_bad_images_and_bounds_are_named():
    with pytest.raises(ImageError, match="cannot decode"):
        ImageRef.from_bytes(b"not an image")
    with pytest.raises(ImageError, match="min_pixels"):
        canonical_size(100, 100, min_pixels=10, max_pixels=1000)
    with pytest.raises(ImageError, match="max_pixels"):
        canonical_size(100, 100, min_pixels=4000, max_pixels=3136)
    with pytest.raises(ImageError, match="cannot be canonicalised"):
        canonicalize(Image.new("RGB", (10000, 10)), 3136, 12544)


@pytest.mark.parametrize("size", [(30, 30), (200, 150), (900, 700)])
def test_image_pad_count_reads_the_processors_own_pixel_bounds(size):
    """transformers 5 keeps the pixel bounds only in the image processor's `size` (`shortest_edge` /
    `longest_edge`; no `min_pixels` attribute): the pad count must follow the processor's bounds, not a default."""
    from transformers import Qwen2VLImageProcessorPil

    from rlinf_ext.protocol.images import image_pad_count

    processor = Qwen2VLImageProcessorPil(
        min_pixels=56 * 56 * 4, max_pixels=28 * 28 * 64, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    ref = canonicalize(_jpeg(size), min_pixels=28 * 28, max_pixels=1000 * 1000)
    grid = processor(images=[ref.to_pil()], return_tensors="pt")["image_grid_thw"][0]
    assert image_pad_count(processor, ref) == int(grid.prod()) // 4
    count = image_pad_count(processor, ref)
    assert 16 <= count <= 64 and (count == 16 if size == (30, 30) else True)  # 56*56*4 px = 16 tokens at least
