"""Helpers of the image-search tests: pickles laid out like MMSearch-R1's released cache."""

from __future__ import annotations

import copyreg
import io
import pickle

from PIL import Image


def encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def opened(image: Image.Image, fmt: str) -> Image.Image:
    """The image as a decoded file object (what the cache pickled: JpegImageFile / PngImageFile)."""
    image = Image.open(io.BytesIO(encoded(image, fmt)))
    image.load()
    return image


class OldPillowPickler(pickle.Pickler):
    """Pickles JPEG files with Pillow 11.1's 7-element state ([info, mode, size, palette, data, layers, layer]);
    newer Pillows write 8 elements and their `pickle.load` fails on these files."""

    def reducer_override(self, obj):
        from PIL.JpegImagePlugin import JpegImageFile

        if isinstance(obj, JpegImageFile):
            state = Image.Image.__getstate__(obj) + [obj.layers, obj.layer]
            return copyreg.__newobj__, (type(obj),), state
        return NotImplemented


def cache_pickle_bytes(entries: dict, old_pillow: bool = False) -> bytes:
    out = io.BytesIO()
    (OldPillowPickler if old_pillow else pickle.Pickler)(out, protocol=4).dump(entries)
    return out.getvalue()
