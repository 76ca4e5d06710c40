"""Load MMSearch-R1's image-search cache pickle without running any of its code.

The released `fvqa_*_image_search_results_cache.pkl` is `{data_id: {"tool_returned_web_title_list": [str],
"tool_returned_images_urls": [url str | pickled PIL image]}}`. A stock `pickle.load` would import and run
whatever the file names, and it fails across Pillow versions anyway (a JPEG's pickled state has 7 elements
under Pillow 11.1 and 8 under newer releases, and `JpegImageFile.__setstate__` unpacks them by position).

Here only a closed list of PIL image classes may be named; each becomes an inert `PickledImage` that just
keeps its state, and the image is rebuilt from the first five state elements, which every Pillow since 9
writes the same way: `[info, mode, size, palette, pixel bytes, ...]`. Any other global (`os.system`,
`builtins.eval`, `copyreg._reconstructor`, ...) is refused before it is imported. The file size is bounded
and its sha256 recorded, so a run's metadata names the exact cache it used.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (module, class) names under which Pillow pickles its image objects
ALLOWED_IMAGE_CLASSES = frozenset(
    {
        ("PIL.Image", "Image"),
        ("PIL.ImageFile", "ImageFile"),
        ("PIL.JpegImagePlugin", "JpegImageFile"),
        ("PIL.MpoImagePlugin", "MpoImageFile"),
        ("PIL.PngImagePlugin", "PngImageFile"),
        ("PIL.WebPImagePlugin", "WebPImageFile"),
        ("PIL.GifImagePlugin", "GifImageFile"),
        ("PIL.BmpImagePlugin", "BmpImageFile"),
        ("PIL.TiffImagePlugin", "TiffImageFile"),
    }
)
MAX_IMAGE_PIXELS = 64 * 1024 * 1024  # a pickled thumbnail larger than this is refused, not decoded


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names something other than a PIL image class."""


class PickledImage:
    """Inert stand-in for a pickled PIL image: it only stores the state it is given."""

    def __init__(self, *args: Any) -> None:
        self.state: Any = None
        self.class_name = ""

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _stand_in(class_name: str) -> type:
    return type("PickledImage", (PickledImage,), {"class_name": class_name})


class CacheUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_IMAGE_CLASSES:
            return _stand_in(f"{module}.{name}")
        raise UnsafePickleError(
            f"refused global {module}.{name}: an image-search cache may only contain dicts, lists, strings and "
            "PIL images; this file would run other code when loaded with pickle. Rebuild the cache or use "
            "tools.image_search.backend: cache_dir"
        )


def image_from_state(record: PickledImage):
    """The RGB PIL image of a pickled PIL image's state (Pillow >= 9 layout, any number of trailing elements)."""
    from PIL import Image

    state = record.state
    if not isinstance(state, (list, tuple)) or len(state) < 5:
        raise ValueError(
            f"pickled {record.class_name or 'image'} has an unknown state layout "
            f"({type(state).__name__} of length {len(state) if hasattr(state, '__len__') else '?'}); "
            "expected [info, mode, size, palette, data, ...]"
        )
    _info, mode, size, palette, data = state[:5]
    if not isinstance(mode, str) or not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"pickled {record.class_name}: mode must be a str and data bytes")
    width, height = (int(v) for v in size)
    if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"pickled {record.class_name}: size {width}x{height} is out of range")
    image = Image.frombytes(mode, (width, height), bytes(data))
    if palette:
        image.putpalette(list(palette))
    return image.convert("RGB") if image.mode != "RGB" else image


@dataclass(frozen=True)
class LoadedPickle:
    data: Any
    sha256: str
    size_bytes: int


def load_cache_pickle(path: str | Path, max_bytes: int) -> LoadedPickle:
    """Read and restrictedly unpickle `path` (refusing files over `max_bytes`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image-search cache pickle {path} does not exist")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(
            f"image-search cache {path} has {size} bytes, over tools.image_search.max_cache_bytes="
            f"{max_bytes}; raise the limit if the file is trusted to be this large"
        )
    raw = path.read_bytes()
    data = CacheUnpickler(io.BytesIO(raw)).load()
    return LoadedPickle(data=data, sha256=hashlib.sha256(raw).hexdigest(), size_bytes=size)
