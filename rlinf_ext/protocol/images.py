"""Images at the seams: a content-addressed `ImageRef` and the one canonicalisation rule.

Every image that reaches a model (a question image, a search thumbnail) is canonicalised once, where it
enters the project: RGB, both sides multiples of 28 (patch 14 x merge 2), pixel count within [min, max],
stored as PNG bytes. The resize is transformers' own `smart_resize` for Qwen2-VL, so the HF processor's
resize and SGLang's (factor 28, hard-coded) are identities on a canonical image and every engine sees the
same grid, hence the same number of `<|image_pad|>` tokens.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

FACTOR = 28  # patch_size 14 * merge_size 2: one language-model token per 28x28 pixels


class ImageError(ValueError):
    """An image that cannot be decoded or canonicalised (names the image and the fix)."""


@dataclass(frozen=True)
class ImageRef:
    """An image as PNG (or other encoded) bytes, addressed by the sha1 of those bytes."""

    sha1: str
    data: bytes
    width: int
    height: int

    @classmethod
    def from_bytes(cls, data: bytes) -> "ImageRef":
        image = open_image(data)
        return cls(hashlib.sha1(data).hexdigest(), bytes(data), image.width, image.height)

    def to_pil(self):
        image = open_image(self.data)
        return image.convert("RGB") if image.mode != "RGB" else image

    @property
    def tokens(self) -> int:
        """Language-model tokens of this image when canonical (one per 28x28 block)."""
        return (self.width // FACTOR) * (self.height // FACTOR)


def open_image(data: bytes, what: str = "image"):
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(f"{what}: cannot decode {len(data)} bytes as an image ({exc})") from None
    return image


def canonical_size(width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) after transformers' Qwen2-VL `smart_resize` with factor 28."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # no torchvision

    check_pixel_bounds(min_pixels, max_pixels)
    try:
        h, w = smart_resize(height, width, factor=FACTOR, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError as exc:  # aspect ratio > 200 or a side below 28 pixels
        raise ImageError(f"image of {width}x{height} pixels cannot be canonicalised: {exc}") from None
    return w, h


def check_pixel_bounds(min_pixels: int, max_pixels: int) -> None:
    if min_pixels < FACTOR * FACTOR:
        raise ImageError(f"min_pixels={min_pixels} is below one 28x28 block ({FACTOR * FACTOR}); raise it")
    if max_pixels < min_pixels:
        raise ImageError(f"max_pixels={max_pixels} is below min_pixels={min_pixels}; swap or raise them")


def is_canonical(width: int, height: int, min_pixels: int, max_pixels: int) -> bool:
    return canonical_size(width, height, min_pixels, max_pixels) == (width, height)


def encode_png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)  # deterministic for equal pixels
    return out.getvalue()


def canonicalize(image: Any, min_pixels: int, max_pixels: int, what: str = "image") -> ImageRef:
    """A PIL image or encoded bytes -> the canonical `ImageRef` (RGB PNG of a canonical size).

    Bytes that already are an RGB PNG of canonical size are kept as they are (same sha1 on every pass)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        pil = open_image(data, what)
        if pil.format == "PNG" and pil.mode == "RGB" and is_canonical(pil.width, pil.height, min_pixels, max_pixels):
            return ImageRef(hashlib.sha1(data).hexdigest(), data, pil.width, pil.height)
    elif isinstance(image, Image.Image):
        pil = image
    else:
        raise ImageError(f"{what}: expected image bytes or a PIL image, got {type(image).__name__}")
    rgb = pil.convert("RGB") if pil.mode != "RGB" else pil
    width, height = canonical_size(rgb.width, rgb.height, min_pixels, max_pixels)
    if (width, height) != rgb.size:
        rgb = rgb.resize((width, height), resample=Image.Resampling.BICUBIC)
    data = encode_png(rgb)
    return ImageRef(hashlib.sha1(data).hexdigest(), data, width, height)


def image_pad_count(image_processor: Any, image: ImageRef) -> int:
    """`<|image_pad|>` tokens a Qwen2-VL image processor gives `image`: its resize (`smart_resize` with
    factor patch*merge and the processor's pixel bounds), one token per (patch*merge)^2 pixels."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # no torchvision

    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    # transformers 5 keeps the pixel bounds only in `size` (no `min_pixels` / `max_pixels` attributes)
    size = getattr(image_processor, "size", None) or {}
    low, high = size.get("shortest_edge"), size.get("longest_edge")
    low = getattr(image_processor, "min_pixels") if low is None else low
    high = getattr(image_processor, "max_pixels") if high is None else high
    h, w = smart_resize(image.height, image.width, factor=factor, min_pixels=low, max_pixels=high)
    return (h // factor) * (w // factor)
